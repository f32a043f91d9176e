/*
 * http_server.c: the loopback server for bench/http.lua. One thread, epoll,
 * HTTP/1.1 keep-alive; every request (GET, or a body sized by
 * Content-Length) gets the same small 200 response. Prints "PORT <n>" once
 * listening and serves until killed. Fast enough that the clients, not the
 * server, are what the benchmark measures.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUFSZ 16384

static const char RESPONSE[] =
  "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";

typedef struct conn { int fd; size_t len; char buf[BUFSZ]; } conn;

static void nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* Bytes of the first complete request in c->buf, or 0 if incomplete. */
static size_t request_size(conn *c) {
  char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
  if (!end) return 0;
  size_t head = (size_t)(end - c->buf) + 4, body = 0;
  for (char *p = c->buf; p < end; p++) {
    if (*p == '\n' && strncasecmp(p + 1, "content-length:", 15) == 0) body = strtoul(p + 16, NULL, 10);
  }
  return c->len >= head + body ? head + body : 0;
}

/* Reads what is there and answers every complete request; 0 = close. */
static int serve(conn *c) {
  for (;;) {
    ssize_t n = read(c->fd, c->buf + c->len, BUFSZ - c->len);
    if (n == 0) return 0;
    if (n < 0) return errno == EAGAIN;
    c->len += (size_t)n;
    size_t r;
    while ((r = request_size(c)) > 0) {
      if (write(c->fd, RESPONSE, sizeof RESPONSE - 1) < 0) return 0;
      memmove(c->buf, c->buf + r, c->len - r);
      c->len -= r;
    }
    if (c->len == BUFSZ) return 0;
  }
}

static int listen_any(void) {
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
  socklen_t alen = sizeof a;
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4096)) { perror("listen"); exit(1); }
  getsockname(fd, (struct sockaddr *)&a, &alen);
  printf("PORT %d %d\n", ntohs(a.sin_port), (int)getpid());
  fflush(stdout);
  nonblock(fd);
  return fd;
}

static void accept_all(int ep, int lfd) {
  int fd, one = 1;
  while ((fd = accept(lfd, NULL, NULL)) >= 0) {
    conn *c = calloc(1, sizeof *c);
    c->fd = fd;
    nonblock(fd);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
}

int main(void) {
  int lfd = listen_any(), ep = epoll_create1(0);
  struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL }, evs[256];
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      conn *c = evs[i].data.ptr;
      if (!c) { accept_all(ep, lfd); continue; }
      if (!serve(c)) { close(c->fd); free(c); }
    }
  }
}
