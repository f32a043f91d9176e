/*
 * sb_zygote.c: starts pid 1 of each sandbox (the supervisor, sb_super.c).
 *
 * clone() copies the caller's page tables, so cloning the engine itself
 * costs more the larger its heap grows. Instead, at the first sandbox the
 * engine forks a small helper, the zygote, whose memory stays what the
 * engine's was then; it clones every later supervisor on request.
 *
 * One request at a time: the engine copies the config into a MAP_SHARED
 * page area made before the fork, sends one message over a SOCK_SEQPACKET
 * socketpair with the supervisor's socket end and the memory group fd, and
 * waits (blocking, as the clone it replaces did) for the reply: the pid
 * with a pidfd (CLONE_PIDFD), or -errno.
 *
 * Lifetimes: the zygote dies with the engine (PR_SET_PDEATHSIG), and each
 * supervisor with the zygote. The zygote reaps its children (SA_NOCLDWAIT),
 * so the engine watches a supervisor through its pidfd, not ev_child. If the
 * zygote cannot start or dies, the engine clones directly, as before.
 */
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif

#define ZYGOTE_SPAWN 1
#define REPLY_TIMEOUT_MS 5000
#define GONE (-2)              /* the zygote is gone: try again directly */

typedef struct spawn_arg {
  const sb_config *cfg;
  int sock, cmd_fd;
} spawn_arg;

static struct {
  pid_t pid;                   /* 0 = never started */
  int sock;                    /* the engine's end; -1 = none (gone) */
  uint32_t seq;
  sb_config *cfg;              /* MAP_SHARED: the request's config */
} z = {0, -1, 0, NULL};

/* ---- the supervisor's first steps (in the clone, either parent) ------------ */

/* pid 1 of the sandbox: fd 3 is its socket, fd 4 the memory group (if any),
 * nothing else is open, the shared request area is unmapped; set up, report,
 * serve. Never returns. */
static int child_main(void *arg) {
  spawn_arg *a = arg;
  char msg[512] = "";
  /* The engine writes the next request there: no supervisor, which runs
   * code the sandbox can influence, may keep a way to change it. */
  if (z.cfg) munmap(z.cfg, sizeof *z.cfg);
  int sock = fcntl(a->sock, F_DUPFD, 10);
  int cmd = a->cmd_fd >= 0 ? fcntl(a->cmd_fd, F_DUPFD, 10) : -1;
  if (sock < 0 || dup2(sock, 3) != 3) _exit(1);
  if (cmd >= 0 && dup2(cmd, 4) == 4) eng_sb_cmd_cgroup_fd = 4;
  close_range(0, 2, 0);
  close_range(eng_sb_cmd_cgroup_fd == 4 ? 5 : 4, ~0U, 0);
  signal(SIGCHLD, SIG_DFL);       /* the zygote ignores it; setup may wait */
  setsid();                       /* a Ctrl-C for the engine is not for us */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  struct pollfd pf = {3, 0, 0};
  if (poll(&pf, 1, 0) > 0 && (pf.revents & POLLHUP)) _exit(1);  /* engine gone */
  for (int i = 0; i < 3; i++) if (open("/dev/null", O_RDWR) < 0) _exit(1);
  int err = eng_sb_setup(a->cfg, msg, sizeof msg);
  sb_msg m = {SB_READY, 0, -err, 0, 0};
  if (err && !*msg) snprintf(msg, sizeof msg, "sandbox setup failed");
  eng_sb_send(3, &m, msg, err ? strlen(msg) + 1 : 0, NULL, 0);
  if (err) _exit(1);
  eng_sb_serve(3);
}

/* Clones pid 1 into its namespaces; the child works from its own copy of
 * cfg. Returns the pid with *pidfd set (close-on-exec), or -1. */
static pid_t clone_child(const sb_config *cfg, int sock, int cmd_fd, int *pidfd) {
  static char stack[256 * 1024] __attribute__((aligned(16)));
  spawn_arg a = {cfg, sock, cmd_fd};
  int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC |
              (cfg->net_none ? CLONE_NEWNET : 0) | CLONE_PIDFD | SIGCHLD;
  *pidfd = -1;
  return clone(child_main, stack + sizeof stack, flags, &a, pidfd);
}

/* ---- copying the config ----------------------------------------------------- */

static void copy_str(char *d, const char *s, size_t cap) {
  size_t n = strnlen(s, cap - 1);
  memcpy(d, s, n);
  d[n] = 0;
}

/* Copies what eng_sb_setup reads: the scalars and the used entries only
 * (the struct is ~0.5 MB of mostly unused PATH_MAX arrays). Keep in step
 * with sb_config. */
static void cfg_copy(sb_config *d, const sb_config *s) {
  copy_str(d->id, s->id, sizeof d->id);
  copy_str(d->mnt, s->mnt, PATH_MAX);
  copy_str(d->upper_dir, s->upper_dir, PATH_MAX);
  copy_str(d->workdir, s->workdir, PATH_MAX);
  copy_str(d->mask, s->mask, PATH_MAX);
  d->nlayers = s->nlayers < SB_MAX_LAYERS ? s->nlayers : SB_MAX_LAYERS;
  d->nhide = s->nhide < SB_MAX_EXTRA ? s->nhide : SB_MAX_EXTRA;
  d->nmounts = s->nmounts < SB_MAX_EXTRA ? s->nmounts : SB_MAX_EXTRA;
  for (int i = 0; i < d->nlayers; i++) copy_str(d->layers[i], s->layers[i], PATH_MAX);
  for (int i = 0; i < d->nhide; i++) copy_str(d->hide[i], s->hide[i], PATH_MAX);
  for (int i = 0; i < d->nmounts; i++) {
    copy_str(d->mount_src[i], s->mount_src[i], PATH_MAX);
    copy_str(d->mount_dst[i], s->mount_dst[i], PATH_MAX);
    d->mount_ro[i] = s->mount_ro[i];
  }
  d->disk = s->disk;
  d->net_none = s->net_none;
  d->bpf = s->bpf;             /* the zygote inherited the engine's program */
}

/* ---- the zygote ---------------------------------------------------------------- */

/* Answers one request: clones pid 1 from a private copy of the shared config
 * (the engine may overwrite it for the next request while this child still
 * reads it), replies pid + pidfd or -errno, and keeps no descriptor. */
static void zygote_serve(int fd, const sb_msg *m, int *fds, int nfds) {
  static sb_config cfg;
  sb_msg r = {m->op, m->seq, -EINVAL, 0, 0};
  int pidfd = -1;
  if (m->op == ZYGOTE_SPAWN && nfds >= 1) {
    cfg_copy(&cfg, z.cfg);
    pid_t pid = clone_child(&cfg, fds[0], nfds > 1 ? fds[1] : -1, &pidfd);
    r.a = pid < 0 ? -errno : pid;
  }
  for (int i = 0; i < nfds; i++) close(fds[i]);
  eng_sb_send(fd, &r, NULL, 0, &pidfd, pidfd >= 0 ? 1 : 0);
  if (pidfd >= 0) close(pidfd);
}

/* Detaches from the engine's session, signals and descriptors (keeping fd),
 * and dies with the engine, even one that died before the prctl. */
static void zygote_init(int fd, pid_t engine) {
  struct sigaction sa = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
  sigset_t none;
  setsid();                         /* a Ctrl-C for the engine is not for us */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != engine) _exit(0);
  prctl(PR_SET_NAME, "engine-zygote");
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);    /* supervisors are reaped by the kernel */
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (fd > 0) close_range(0, (unsigned)fd - 1, 0);
  close_range((unsigned)fd + 1, ~0U, 0);
}

/* The zygote's loop: one request, one reply, until the engine's end closes.
 * Uses no malloc and no stdio (it was forked from a process with threads). */
static void zygote_main(int fd, pid_t engine) __attribute__((noreturn));
static void zygote_main(int fd, pid_t engine) {
  sb_msg m;
  int fds[3], nfds;
  zygote_init(fd, engine);
  for (;;) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, -1) < 0 && errno != EINTR) _exit(1);
    ssize_t n = eng_sb_recv(fd, &m, NULL, 0, fds, &nfds);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR && errno != EBADMSG)) _exit(0);
    if (n > 0) zygote_serve(fd, &m, fds, nfds);
  }
}

/* ---- the engine's side ------------------------------------------------------------ */

/* Forks the zygote, once per engine; on failure z.sock stays -1 and every
 * sandbox is cloned directly. */
static void zygote_start(void) {
  int sv[2];
  pid_t engine = getpid();
  z.pid = -1;
  z.cfg = mmap(NULL, sizeof *z.cfg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (z.cfg == MAP_FAILED) { z.cfg = NULL; return; }
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return;
  pid_t pid = fork();
  if (pid == 0) zygote_main(sv[1], engine);
  close(sv[1]);
  if (pid < 0) { close(sv[0]); return; }
  z.pid = pid;
  z.sock = sv[0];
}

/* Gives up on the zygote: SIGKILL takes with it any supervisor it cloned for
 * the unanswered request (PR_SET_PDEATHSIG), and libev reaps it. */
static pid_t zygote_lost(void) {
  if (z.pid > 0) kill(z.pid, SIGKILL);
  if (z.sock >= 0) close(z.sock);
  z.sock = -1;
  return GONE;
}

/* Waits for the reply to request seq; 0, or -1 when none came in time. */
static int zygote_reply(uint32_t seq, sb_msg *r, int *fds, int *nfds) {
  struct pollfd pf = {z.sock, POLLIN, 0};
  int rc;
  do rc = poll(&pf, 1, REPLY_TIMEOUT_MS); while (rc < 0 && errno == EINTR);
  if (rc <= 0 || eng_sb_recv(z.sock, r, NULL, 0, fds, nfds) <= 0) return -1;
  if (r->seq == seq && r->op == ZYGOTE_SPAWN) return 0;
  for (int i = 0; i < *nfds; i++) close(fds[i]);
  return -1;
}

/* Has the zygote clone pid 1: its pid with *pidfd set, -1 with errno (the
 * clone failed), or GONE (nothing it may have started outlives this call
 * for long: the supervisor socket's engine end is closed by the caller). */
static pid_t zygote_spawn(const sb_config *cfg, int sock, int cmd_fd, int *pidfd) {
  int fds[3] = {sock, cmd_fd, -1}, nfds;
  sb_msg m = {ZYGOTE_SPAWN, ++z.seq, 0, 0, 0}, r;
  cfg_copy(z.cfg, cfg);
  if (eng_sb_send(z.sock, &m, NULL, 0, fds, cmd_fd >= 0 ? 2 : 1) < 0 ||
      zygote_reply(m.seq, &r, fds, &nfds) < 0)
    return zygote_lost();
  if (r.a < 0) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    errno = r.a == INT32_MIN ? EIO : -r.a;
    return -1;
  }
  if (r.a == 0 || nfds != 1) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    return zygote_lost();
  }
  *pidfd = fds[0];
  return r.a;
}

pid_t eng_sb_spawn(const sb_config *cfg, int cmd_fd, int *sock, int *pidfd) {
  if (z.pid == 0) zygote_start();
  for (;;) {
    int pair[2], err;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) return -1;
    pid_t pid = z.sock >= 0 ? zygote_spawn(cfg, pair[1], cmd_fd, pidfd)
                            : clone_child(cfg, pair[1], cmd_fd, pidfd);
    err = errno;
    close(pair[1]);
    if (pid >= 0) { *sock = pair[0]; return pid; }
    close(pair[0]);
    errno = err;
    if (pid != GONE) return -1;
  }
}
