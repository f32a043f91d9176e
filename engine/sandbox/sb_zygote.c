/*
 * sb_zygote.c: starts pid 1 of each sandbox (the supervisor, sb_super.c).
 *
 * clone() copies the caller's page tables, and the new process inherits its
 * resident size, so pid 1 is never cloned from the engine (hundreds of
 * mappings, a heap that grows). At the first sandbox the engine starts the
 * zygote: the static binary engine-zygote next to it (engine/zygote/main.c,
 * built from this file, sb_super.c and sb_rootfs.c), a dozen mappings and a
 * few hundred KiB. It clones every supervisor on request, so creating and
 * tearing down a box costs the same at any engine size, and an OOM kill in
 * a box's memory group never prefers pid 1 for its size.
 *
 * One request at a time: the engine copies the config into a shared memfd
 * mapping, sends one message over a SOCK_SEQPACKET socketpair with the
 * supervisor's socket end, and waits (blocking, as a clone would) for the
 * reply: the pid with a pidfd (CLONE_PIDFD), or -errno. The supervisor
 * makes and joins its cgroups itself, in a helper running alongside its
 * setup, so the engine never blocks on a cgroup move (each can wait out an
 * RCU grace period under cgroup v1).
 *
 * Lifetimes: the zygote dies with the engine (PR_SET_PDEATHSIG), and each
 * supervisor with the zygote. The zygote reaps its children (SA_NOCLDWAIT),
 * so the engine watches a supervisor through its pidfd, not ev_child. A
 * zygote that dies or hangs (5 s) is killed and started again.
 */
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif

#define ZYGOTE_SPAWN 1
#define REPLY_TIMEOUT_MS 5000
#define GONE (-2)              /* the zygote is gone: start it again */

typedef struct spawn_arg {
  const sb_config *cfg;
  int sock, netns;             /* netns: a spare to enter, or -1 */
} spawn_arg;

static struct {
  pid_t pid;                   /* 0 = not running */
  int sock;                    /* the engine's end; -1 = none */
  uint32_t seq;
  sb_config *cfg;              /* MAP_SHARED memfd: the request's config */
  int cfg_fd;
} z = {0, -1, 0, NULL, -1};

/* In the zygote: a fresh network namespace (lo up) made in the background
 * by a forked maker, so that a box's clone need not create one: that is
 * two thirds of the clone's cost (~0.5 ms here). One spare at a time;
 * without one a box gets its namespace from clone() as before. */
static struct {
  int fd;                      /* the spare's ns fd, or -1 */
  int pipe[2];                 /* SOCK_SEQPACKET: maker -> zygote */
  int making;
} spare = {-1, {-1, -1}, 0};

/* ---- the supervisor's first steps (in the clone) --------------------------- */

/* Forks a helper that makes pid 1's cgroups, sets their limits and moves
 * pid 1 into them, while pid 1 builds the root (each move waits out an
 * RCU grace period under cgroup v1). The helper works from the groups'
 * parent directories, opened here before pid 1 leaves the host's root.
 * Returns its pid, or -1. */
static pid_t cgroup_helper(const sb_cgroup *cg) {
  int dirs[3] = {-1, -1, -1};
  pid_t pid = -1;
  char dir[PATH_MAX];
  for (int i = 0; i < 3; i++) {
    snprintf(dir, sizeof dir, "%s", cg->path[i]);
    char *slash = strrchr(dir, '/');
    if (!slash) continue;
    *slash = 0;
    if ((dirs[i] = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) goto out;
  }
  pid = fork();
  if (pid == 0) _exit(eng_sb_cgroup_enter(cg, dirs, "1") < 0 ? (errno ? errno & 0xff : EIO) : 0);
out:
  for (int i = 0; i < 3; i++) if (dirs[i] >= 0) close(dirs[i]);
  return pid;
}

/* Waits for the cgroup helper; 0 or an errno. */
static int cgroup_helper_wait(pid_t helper) {
  int st;
  while (waitpid(helper, &st, 0) < 0) if (errno != EINTR) return errno;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return EINTR;
}

/* Reports setup: READY with errno and a message (empty on success). */
static void report_ready(int err, char *msg, size_t len) {
  sb_msg m = {SB_READY, 0, -err, 0, 0};
  if (err && !*msg) snprintf(msg, len, "sandbox setup failed");
  eng_sb_send(3, &m, msg, err ? strlen(msg) + 1 : 0, NULL, 0);
}

/* pid 1 of the sandbox: fd 3 is its socket, nothing else is open, the shared
 * request area is unmapped; set up (cgroups alongside), report, serve. */
static int child_main(void *arg) {
  spawn_arg *a = arg;
  char msg[512] = "";
  int err = 0;
  /* The engine writes the next request there: no supervisor, which runs
   * code the sandbox can influence, may keep a way to change it. */
  if (z.cfg) munmap(z.cfg, sizeof *z.cfg);
  if (a->netns >= 0 && setns(a->netns, CLONE_NEWNET) < 0) _exit(1);
  int sock = fcntl(a->sock, F_DUPFD, 10);
  if (sock < 0 || dup2(sock, 3) != 3) _exit(1);
  close_range(0, 2, 0);
  close_range(4, ~0U, 0);
  signal(SIGCHLD, SIG_DFL);       /* the zygote ignores it; setup may wait */
  setsid();                       /* a Ctrl-C for the engine is not for us */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  struct pollfd pf = {3, 0, 0};
  if (poll(&pf, 1, 0) > 0 && (pf.revents & POLLHUP)) _exit(1);  /* engine gone */
  for (int i = 0; i < 3; i++) if (open("/dev/null", O_RDWR) < 0) _exit(1);
  pid_t helper = cgroup_helper(&a->cfg->cg);
  if (helper < 0) {
    err = errno;
    snprintf(msg, sizeof msg, "cannot set up the sandbox cgroups (%s)", strerror(err));
  } else if (!(err = eng_sb_setup(a->cfg, msg, sizeof msg)) && (err = cgroup_helper_wait(helper))) {
    snprintf(msg, sizeof msg, "cannot set up the sandbox cgroups (%s)", strerror(err));
  }
  report_ready(err, msg, sizeof msg);
  if (err) _exit(1);
  eng_sb_serve(3);
}

/* Clones pid 1 into its namespaces; the child works from its own copy of
 * cfg, in netns if >= 0 (else a new one if cfg->net_none). Returns the pid
 * with *pidfd set (close-on-exec), or -1. */
static pid_t clone_child(const sb_config *cfg, int sock, int netns, int *pidfd) {
  static char stack[256 * 1024] __attribute__((aligned(16)));
  spawn_arg a = {cfg, sock, netns};
  int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC |
              (cfg->net_none && netns < 0 ? CLONE_NEWNET : 0) | CLONE_PIDFD | SIGCHLD;
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
 * (the struct is ~0.6 MB of mostly unused PATH_MAX arrays). Keep in step
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
  for (int i = 0; i < 3; i++) copy_str(d->cg.path[i], s->cg.path[i], PATH_MAX);
  copy_str(d->cg.id, s->cg.id, sizeof d->cg.id);
  d->cg.memory = s->cg.memory;
  d->cg.pids = s->cg.pids;
  d->cg.cpus = s->cg.cpus;
  d->cg.v2 = s->cg.v2;
  d->disk = s->disk;
  d->net_none = s->net_none;
  d->bpf_len = s->bpf_len < SB_MAX_BPF ? s->bpf_len : SB_MAX_BPF;
  memcpy(d->bpf, s->bpf, d->bpf_len * sizeof *d->bpf);
}

/* ---- the zygote ---------------------------------------------------------------- */

/* The maker: a new network namespace with lo up, sent to the zygote. */
static void spare_maker(void) __attribute__((noreturn));
static void spare_maker(void) {
  sb_msg m = {ZYGOTE_SPAWN, 0, 0, 0, 0};
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (unshare(CLONE_NEWNET) < 0 || eng_sb_loopback_up() < 0) _exit(1);
  int fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (fd < 0) _exit(1);
  eng_sb_send(spare.pipe[1], &m, NULL, 0, &fd, 1);
  _exit(0);
}

/* Starts a maker unless a spare exists or is on its way. */
static void spare_make(void) {
  if (spare.fd >= 0 || spare.making || spare.pipe[0] < 0) return;
  pid_t pid = fork();
  if (pid == 0) spare_maker();
  spare.making = pid > 0;
}

/* Takes the maker's namespace (or its failure: then no more spares). */
static void spare_receive(void) {
  sb_msg m;
  int fds[3], nfds = 0;
  ssize_t n = eng_sb_recv(spare.pipe[0], &m, NULL, 0, fds, &nfds);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  spare.making = 0;
  if (nfds == 1 && spare.fd < 0) { spare.fd = fds[0]; return; }
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* Answers one request: clones pid 1 from a private copy of the shared config
 * (the engine may overwrite it for the next request while this child still
 * reads it), replies pid + pidfd or -errno, and keeps no descriptor. */
static void zygote_serve(int fd, const sb_msg *m, int *fds, int nfds) {
  static sb_config cfg;
  sb_msg r = {m->op, m->seq, -EINVAL, 0, 0};
  int pidfd = -1;
  if (m->op == ZYGOTE_SPAWN && nfds >= 1) {
    cfg_copy(&cfg, z.cfg);
    int netns = cfg.net_none ? spare.fd : -1;
    pid_t pid = clone_child(&cfg, fds[0], netns, &pidfd);
    r.a = pid < 0 ? -errno : pid;
    if (pid > 0 && netns >= 0) { close(spare.fd); spare.fd = -1; }
  }
  for (int i = 0; i < nfds; i++) close(fds[i]);
  eng_sb_send(fd, &r, NULL, 0, &pidfd, pidfd >= 0 ? 1 : 0);
  if (pidfd >= 0) close(pidfd);
  spare_make();
}

/* Detaches from the engine's session and signals, keeps only fd, and dies
 * with the engine, even one that died before the prctl. */
static void zygote_init(int fd, pid_t engine) {
  struct sigaction sa = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
  sigset_t none;
  setsid();                         /* a Ctrl-C for the engine is not for us */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != engine) _exit(0);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);    /* supervisors are reaped by the kernel */
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (fd > 0) close_range(0, (unsigned)fd - 1, 0);
  close_range((unsigned)fd + 1, ~0U, 0);
}

/* The zygote's loop: one request, one reply, until the engine's end closes. */
void eng_sb_zygote_main(int fd, int cfg_fd, pid_t engine) {
  sb_msg m;
  int fds[3], nfds;
  z.cfg = mmap(NULL, sizeof *z.cfg, PROT_READ, MAP_SHARED, cfg_fd, 0);
  if (z.cfg == MAP_FAILED) _exit(1);
  zygote_init(fd, engine);
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, spare.pipe) < 0)
    spare.pipe[0] = -1;
  spare_make();
  for (;;) {
    struct pollfd pf[2] = {{fd, POLLIN, 0}, {spare.pipe[0], POLLIN, 0}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) _exit(1);
    if (pf[1].revents) spare_receive();
    if (!pf[0].revents) continue;
    ssize_t n = eng_sb_recv(fd, &m, NULL, 0, fds, &nfds);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR && errno != EBADMSG)) _exit(0);
    if (n > 0) zygote_serve(fd, &m, fds, nfds);
  }
}

/* ---- the engine's side ------------------------------------------------------------ */

/* engine-zygote in the engine's own directory; "" if /proc/self/exe fails. */
static const char *helper_path(void) {
  static char path[PATH_MAX];
  if (*path) return path;
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
  if (n <= 0) return path;
  path[n] = 0;
  char *slash = strrchr(path, '/');
  snprintf(slash ? slash + 1 : path, 32, "engine-zygote");
  return path;
}

/* The shared request area, made once per engine; 0 or -1. */
static int request_area(void) {
  if (z.cfg) return 0;
  z.cfg_fd = memfd_create("engine-sandbox-config", MFD_CLOEXEC);
  if (z.cfg_fd < 0 || ftruncate(z.cfg_fd, sizeof *z.cfg) < 0) return -1;
  void *p = mmap(NULL, sizeof *z.cfg, PROT_READ | PROT_WRITE, MAP_SHARED, z.cfg_fd, 0);
  if (p == MAP_FAILED) return -1;
  z.cfg = p;
  return 0;
}

/* In the forked child: the socket on fd 3, the request area on fd 4, then
 * exec the helper. Async-signal-safe calls only (the engine has threads). */
static void exec_helper(const char *path, int sock, const char *engine) __attribute__((noreturn));
static void exec_helper(const char *path, int sock, const char *engine) {
  int s = fcntl(sock, F_DUPFD, 10), c = fcntl(z.cfg_fd, F_DUPFD, 10);
  char *argv[] = {"engine-zygote", (char *)engine, NULL}, *envp[] = {NULL};
  if (s < 0 || c < 0 || dup2(s, 3) != 3 || dup2(c, 4) != 4) _exit(127);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  execve(path, argv, envp);
  _exit(127);
}

/* Starts the zygote; 0, or -1 with err set. */
static int zygote_start(char *err, size_t errlen) {
  const char *path = helper_path();
  char engine[16];
  int sv[2];
  if (access(path, X_OK) < 0) {
    snprintf(err, errlen, "sandbox helper %s: %s", path, strerror(errno));
    return -1;
  }
  snprintf(engine, sizeof engine, "%d", (int)getpid());
  if (request_area() < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    snprintf(err, errlen, "cannot start the sandbox helper (%s)", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) exec_helper(path, sv[1], engine);
  int e = errno;
  close(sv[1]);
  if (pid < 0) {
    close(sv[0]);
    snprintf(err, errlen, "cannot start the sandbox helper (%s)", strerror(e));
    return -1;
  }
  z.pid = pid;
  z.sock = sv[0];
  return 0;
}

/* Gives up on the zygote: SIGKILL takes with it any supervisor it cloned for
 * the unanswered request (PR_SET_PDEATHSIG), and libev reaps it. */
static pid_t zygote_lost(void) {
  if (z.pid > 0) kill(z.pid, SIGKILL);
  if (z.sock >= 0) close(z.sock);
  z.sock = -1;
  z.pid = 0;
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
static pid_t zygote_spawn(const sb_config *cfg, int sock, int *pidfd) {
  int fds[3] = {sock, -1, -1}, nfds;
  sb_msg m = {ZYGOTE_SPAWN, ++z.seq, 0, 0, 0}, r;
  cfg_copy(z.cfg, cfg);
  if (eng_sb_send(z.sock, &m, NULL, 0, fds, 1) < 0 || zygote_reply(m.seq, &r, fds, &nfds) < 0)
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

/* Starts the zygote when none runs; a zygote found gone is started again
 * once per call (one that keeps dying is an error, not a loop). */
pid_t eng_sb_spawn(const sb_config *cfg, int *sock, int *pidfd, char *err, size_t errlen) {
  for (int tries = 0; tries < 2; tries++) {
    int pair[2];
    if (z.sock < 0 && zygote_start(err, errlen) < 0) return -1;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) break;
    pid_t pid = zygote_spawn(cfg, pair[1], pidfd);
    int e = errno;
    close(pair[1]);
    if (pid >= 0) { *sock = pair[0]; return pid; }
    close(pair[0]);
    errno = e;
    if (pid != GONE) break;
    errno = ECHILD;
  }
  snprintf(err, errlen, "cannot start the sandbox (%s)", strerror(errno));
  return -1;
}
