/*
 * proc_baseline.c: the floor for engine.proc's spawn rate. Runs N times
 * posix_spawn("/bin/true") + waitpid and prints "N <n> seconds <s> rate <r>"
 * (spawns per second) for bench/proc.lua to compare against.
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1000, status;
  char *args[] = {"/bin/true", NULL};
  double t0 = now(), dt;
  for (int i = 0; i < n; i++) {
    pid_t pid;
    if (posix_spawn(&pid, args[0], NULL, NULL, args, environ) != 0) {
      perror("posix_spawn");
      return 1;
    }
    if (waitpid(pid, &status, 0) < 0) {
      perror("waitpid");
      return 1;
    }
  }
  dt = now() - t0;
  printf("N %d seconds %.6f rate %.1f\n", n, dt, n / dt);
  return 0;
}
