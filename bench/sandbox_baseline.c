/*
 * sandbox_baseline: the bare minimum a sandbox start costs, for
 * bench/sandbox.lua to compare against in the same run.
 *
 *   sandbox_baseline box N     N times: clone with the sandbox's namespaces
 *                              (mnt, pid, net, uts, ipc), mount a tmpfs, build
 *                              the same host mask layer, mount the same overlay
 *                              root, /proc, pivot_root, exec /bin/true, wait.
 *   sandbox_baseline spawn N   N times: posix_spawn /bin/true + waitpid.
 *
 * Prints "p50 p95 mean" in seconds, or with a third argument "raw" every
 * sample, one per line. Run as root.
 */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char *keep[] = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
                             "etc", "opt", "var", NULL};
static const char *mnt_dir;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int kept(const char *name) {
  for (int i = 0; keep[i]; i++) if (!strcmp(keep[i], name)) return 1;
  return 0;
}

/* Whiteouts for every top-level host entry not kept; /tmp opaque. */
static int build_mask(void) {
  char path[512];
  struct dirent *de;
  DIR *d = opendir("/");
  if (!d || mkdir("mask", 0755) < 0) return -1;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, ".."))) continue;
    if (kept(de->d_name)) continue;
    snprintf(path, sizeof path, "mask/%s", de->d_name);
    if (!strcmp(de->d_name, "tmp") || !strcmp(de->d_name, "proc") || !strcmp(de->d_name, "dev")) {
      mkdir(path, 01777);
      setxattr(path, "trusted.overlay.opaque", "y", 1, 0);
    } else if (mknod(path, S_IFCHR, makedev(0, 0)) < 0) {
      closedir(d);
      return -1;
    }
  }
  closedir(d);
  return 0;
}

static int child(void *arg) {
  char opts[1024];
  (void)arg;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
      mount("tmpfs", mnt_dir, "tmpfs", 0, "size=1g") < 0 || chdir(mnt_dir) < 0 ||
      mkdir("up", 0755) < 0 || mkdir("work", 0755) < 0 || mkdir("root", 0755) < 0 ||
      build_mask() < 0)
    _exit(10);
  snprintf(opts, sizeof opts, "lowerdir=%s/mask:/,upperdir=%s/up,workdir=%s/work",
           mnt_dir, mnt_dir, mnt_dir);
  if (mount("overlay", "root", "overlay", 0, opts) < 0 || chdir("root") < 0 ||
      syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
      chdir("/") < 0 || mount("proc", "/proc", "proc", 0, NULL) < 0)
    _exit(11);
  execl("/bin/true", "true", (char *)NULL);
  _exit(12);
}

static double one_box(void) {
  static char stack[256 * 1024] __attribute__((aligned(16)));
  int st;
  double t0 = now();
  pid_t pid = clone(child, stack + sizeof stack, CLONE_NEWNS | CLONE_NEWPID |
                    CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC | SIGCHLD, NULL);
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "sandbox_baseline: box failed (status %d)\n", st);
    exit(1);
  }
  return now() - t0;
}

static double one_spawn(void) {
  char *argv[] = {"true", NULL};
  pid_t pid;
  int st;
  double t0 = now();
  if (posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ) != 0 ||
      waitpid(pid, &st, 0) < 0) {
    perror("sandbox_baseline: spawn");
    exit(1);
  }
  return now() - t0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int n = argc > 2 ? atoi(argv[2]) : 200;
  int box = argc > 1 && !strcmp(argv[1], "box");
  double *t = calloc((size_t)n, sizeof *t), sum = 0;
  mnt_dir = getenv("BASELINE_MNT") ? getenv("BASELINE_MNT") : "/run/engine/sandboxes/mnt";
  if (!t || n < 1) return 2;
  for (int i = 0; i < n; i++) sum += t[i] = box ? one_box() : one_spawn();
  if (argc > 3 && !strcmp(argv[3], "raw")) {
    for (int i = 0; i < n; i++) printf("%.6f\n", t[i]);
    return 0;
  }
  qsort(t, (size_t)n, sizeof *t, cmp);
  printf("%.6f %.6f %.6f\n", t[n / 2], t[(n * 95) / 100 < n ? (n * 95) / 100 : n - 1], sum / n);
  return 0;
}
