/*
 * sb_spare.c: the zygote's spare, the start of the next box made ahead.
 *
 * Two steps of a box's birth cost much and need nothing from its config:
 * a new network namespace (~0.5 ms, two thirds of the clone) and fresh
 * cgroups to be born in (mkdir, limits, a move that under cgroup v2 waits
 * out an RCU grace period, 7-15 ms on an idle host). So the zygote keeps
 * one spare: a forked process that has made and joined empty
 * groups (sbz-<engine>-<zygote>-<n>) and a network namespace with lo up,
 * and waits. For a box with network "none" and no cpu quota, the zygote
 * hands the request to the spare, which writes the box's limits into its
 * groups and clones pid 1 (as the zygote's child, CLONE_PARENT) without a
 * new network namespace: pid 1 is born inside both. Then the spare exits
 * and the zygote forks the next. Any other box, or one asked for before
 * the spare is ready, is cloned by the zygote as usual.
 *
 * The spare is never reused: each box gets a namespace and groups nobody
 * ran in. It dies with the zygote (PR_SET_PDEATHSIG); the engine removes
 * an unused spare's groups when it exits, `engine gc` after a crash.
 */
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { SPARE_READY = 1, SPARE_GO, SPARE_DONE };
#define SPARE_TIMEOUT_MS 5000
#define SPARE_WAIT_MS 50       /* for one being made: cheaper than without */
#define MAX_FAILURES 3

static struct {
  pid_t pid;                   /* 0 = none */
  int sock;                    /* the zygote's end, -1 = none */
  int ready;
  int failures;                /* spares that died unused; at 3, no more */
  unsigned n;
  char name[64];               /* its cgroups' name */
} spare = {0, -1, 0, 0, 0, ""};

/* ---- in the spare ---------------------------------------------------------- */

/* Makes and joins the groups and the namespace; 0 or -1. */
static int spare_prepare(sb_cgroup *cg, int *dirs) {
  char err[256];
  if (eng_sb_cgroup_plan(cg, spare.name, 0, 0, 0, err, sizeof err) < 0) return -1;
  if (eng_sb_cgroup_dirs(cg, dirs) < 0) return -1;
  if (eng_sb_cgroup_enter(cg, dirs) < 0) return -1;
  return unshare(CLONE_NEWNET) < 0 || eng_sb_loopback_up() < 0 ? -1 : 0;
}

/* Waits for GO (the supervisor's socket end); that fd, or -1. */
static int spare_wait(int sock) {
  sb_msg m;
  int fds[3], nfds = 0;
  for (;;) {
    struct pollfd pf = {sock, POLLIN, 0};
    if (poll(&pf, 1, -1) < 0 && errno != EINTR) return -1;
    ssize_t n = eng_sb_recv(sock, &m, NULL, 0, fds, &nfds);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return -1;
    if (n > 0 && m.op == SPARE_GO && nfds == 1) return fds[0];
    for (int i = 0; i < nfds; i++) close(fds[i]);
  }
}

/* The spare's life: prepare, report, wait, clone pid 1 once, report, exit. */
static void spare_main(int sock, pid_t zygote) __attribute__((noreturn));
static void spare_main(int sock, pid_t zygote) {
  static sb_config cfg;
  sb_cgroup cg;
  int dirs[3] = {-1, -1, -1}, pidfd = -1;
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != zygote) _exit(1);
  if (sock > 0) close_range(0, (unsigned)sock - 1, 0);
  close_range((unsigned)sock + 1, ~0U, 0);
  sb_msg m = {SPARE_READY, 0, 0, 0, 0};
  if (spare_prepare(&cg, dirs) < 0 || eng_sb_send(sock, &m, NULL, 0, NULL, 0) < 0) _exit(1);
  int sup = spare_wait(sock);
  if (sup < 0) _exit(0);
  eng_sb_cfg_copy(&cfg, eng_sb_request);
  cg.memory = cfg.cg.memory;
  cg.pids = cfg.cg.pids;
  pid_t pid = eng_sb_cgroup_limit(&cg, dirs) < 0 ? -1 : eng_sb_clone_child(&cfg, sup, 1, &pidfd);
  m = (sb_msg){SPARE_DONE, 0, pid < 0 ? -(errno ? errno : EIO) : pid, 0, 0};
  eng_sb_send(sock, &m, NULL, 0, &pidfd, pidfd >= 0 ? 1 : 0);
  _exit(0);
}

/* ---- in the zygote ---------------------------------------------------------- */

/* Forgets the spare. Closing its socket is enough: one still waiting sees
 * the end and exits (no kill: the kernel reaps it at once, SA_NOCLDWAIT, so
 * its pid may already name another process). */
static void spare_drop(void) {
  if (spare.sock >= 0) close(spare.sock);
  spare.pid = 0;
  spare.sock = -1;
  spare.ready = 0;
}

void eng_sb_spare_make(pid_t engine) {
  int sv[2];
  if (spare.pid || spare.failures >= MAX_FAILURES) return;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return;
  snprintf(spare.name, sizeof spare.name, "sbz-%d-%d-%u", (int)engine, (int)getpid(), ++spare.n);
  pid_t zygote = getpid(), pid = fork();
  if (pid == 0) spare_main(sv[1], zygote);
  close(sv[1]);
  if (pid < 0) { close(sv[0]); return; }
  spare.pid = pid;
  spare.sock = sv[0];
}

int eng_sb_spare_fd(void) {
  return spare.sock;
}

/* The spare reported ready, or died before it could serve. */
void eng_sb_spare_event(void) {
  sb_msg m;
  int fds[3], nfds = 0;
  ssize_t n = eng_sb_recv(spare.sock, &m, NULL, 0, fds, &nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0 && m.op == SPARE_READY) { spare.ready = 1; return; }
  spare.failures++;
  spare_drop();
}

/* Waits for the spare's SPARE_DONE; its pid with *pidfd, or -1. */
static pid_t spare_done(int *pidfd) {
  sb_msg m;
  int fds[3], nfds = 0;
  struct pollfd pf = {spare.sock, POLLIN, 0};
  int rc;
  do rc = poll(&pf, 1, SPARE_TIMEOUT_MS); while (rc < 0 && errno == EINTR);
  if (rc <= 0 || eng_sb_recv(spare.sock, &m, NULL, 0, fds, &nfds) <= 0 || m.op != SPARE_DONE) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    errno = EIO;
    return -1;
  }
  if (m.a > 0 && nfds == 1) { *pidfd = fds[0]; return m.a; }
  for (int i = 0; i < nfds; i++) close(fds[i]);
  errno = m.a < 0 ? -m.a : EIO;
  return -1;
}

/* Waits a little for a spare being made (a box made without it would wait
 * out the same cgroup move, and make a namespace too); 1 when ready. */
static int spare_wait_ready(void) {
  struct pollfd pf = {spare.sock, POLLIN, 0};
  double left = SPARE_WAIT_MS;
  while (spare.pid && !spare.ready && left > 0) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (poll(&pf, 1, (int)left) > 0) eng_sb_spare_event();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    left -= (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    pf.fd = spare.sock;
  }
  return spare.ready;
}

pid_t eng_sb_spare_spawn(const sb_config *cfg, int sock, int *pidfd, char *name, size_t len) {
  sb_msg m = {SPARE_GO, 0, 0, 0, 0};
  if (!cfg->net_none || cfg->cg.cpus > 0 || !spare_wait_ready()) return 0;
  snprintf(name, len, "%s", spare.name);
  pid_t pid = eng_sb_send(spare.sock, &m, NULL, 0, &sock, 1) < 0 ? -1 : spare_done(pidfd);
  spare_drop();
  return pid;
}
