/*
 * loop.c: the libev loop and the primitives that need only a timer or a
 * signal: sleep, now, deadlines (what engine.sync.with_timeout stands on),
 * and SIGINT/SIGTERM, which cancel every task.
 */
#include "engine.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define DEADLINE_MT "engine.Deadline"

static struct ev_loop *loop;
static ev_signal sigint_watcher, sigterm_watcher;
static int signal_received;
static int signal_count;
static int interrupt_ref = LUA_NOREF;     /* REPL's Ctrl-C handler, if set */
static lua_State *main_L;

struct ev_loop *eng_loop(void) { return loop; }

int eng_loop_signal(void) { return signal_received; }

/* ---- sleep -------------------------------------------------------------- */

typedef struct sleep_op {
  ev_timer timer;
  eng_task *task;
} sleep_op;

static void sleep_cb(struct ev_loop *l, ev_timer *w, int revents) {
  sleep_op *op = (sleep_op *)w;
  eng_task *t = op->task;
  (void)revents;
  ev_timer_stop(l, w);
  free(op);
  eng_task_wake(t, 0);
}

static void sleep_cleanup(void *data) {
  sleep_op *op = data;
  ev_timer_stop(loop, &op->timer);
  free(op);
}

/* engine.sleep(seconds): sleep(0) just lets every other ready task run. */
static int l_sleep(lua_State *L) {
  double s = luaL_checknumber(L, 1);
  eng_task *t = eng_task_current(L);
  sleep_op *op;
  luaL_argcheck(L, s == s, 1, "NaN");   /* a NaN expiry breaks libev's timer heap order */
  if (!t) return eng_task_block(L, l_sleep);
  if (s <= 0) {
    eng_task_wake(t, 0);
    return eng_task_yield(L, NULL, NULL);
  }
  op = malloc(sizeof *op);
  if (!op) return luaL_error(L, "out of memory");
  op->task = t;
  ev_timer_init(&op->timer, sleep_cb, s, 0);
  ev_now_update(loop);       /* a blocking call (os.execute) may have run */
  ev_timer_start(loop, &op->timer);
  return eng_task_yield(L, sleep_cleanup, op);
}

/* engine.now() -> wall-clock seconds (fractional) */
static int l_now(lua_State *L) {
  lua_pushnumber(L, ev_time());
  return 1;
}

/* engine.monotonic() -> seconds on a clock that never jumps */
static int l_monotonic(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (double)ts.tv_sec + ts.tv_nsec / 1e9);
  return 1;
}

/* ---- deadlines -------------------------------------------------------- */

typedef struct deadline {
  ev_timer timer;
  eng_task *task;
  int error_ref;      /* what the interrupted operation raises */
  int task_ref;       /* keeps the task alive while armed */
  int self_ref;       /* keeps the handle alive while armed (it may be dropped) */
} deadline;

/* Stops the timer and lets go of everything; idempotent, never raises. */
static void deadline_disarm(lua_State *L, deadline *d) {
  ev_timer_stop(loop, &d->timer);
  luaL_unref(L, LUA_REGISTRYINDEX, d->error_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, d->task_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, d->self_ref);
  d->error_ref = d->task_ref = d->self_ref = LUA_NOREF;
  d->task = NULL;
}

static void deadline_cb(struct ev_loop *l, ev_timer *w, int revents) {
  deadline *d = (deadline *)w;
  (void)l; (void)revents;
  lua_rawgeti(main_L, LUA_REGISTRYINDEX, d->error_ref);
  eng_task_interrupt(d->task, main_L, -1);
  lua_pop(main_L, 1);
  deadline_disarm(main_L, d);
}

/* engine.deadline(seconds, err) -> handle: when it expires, the running
 * task's pending operation is abandoned and raises err. handle:cancel(). */
static int l_deadline(lua_State *L) {
  double s = luaL_checknumber(L, 1);
  eng_task *t = eng_task_current(L);
  deadline *d;
  luaL_checkany(L, 2);
  if (!t) return luaL_error(L, "engine.deadline: not inside a task");
  d = lua_newuserdatauv(L, sizeof *d, 0);
  d->task = t;
  d->error_ref = d->task_ref = d->self_ref = LUA_NOREF;
  luaL_setmetatable(L, DEADLINE_MT);
  lua_pushvalue(L, 2);
  d->error_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  eng_task_push(L, t);
  d->task_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  d->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  ev_timer_init(&d->timer, deadline_cb, s > 0 ? s : 0, 0);
  ev_now_update(loop);
  ev_timer_start(loop, &d->timer);
  return 1;
}

static int deadline_cancel(lua_State *L) {
  deadline_disarm(L, luaL_checkudata(L, 1, DEADLINE_MT));
  return 0;
}

/* ---- signals ------------------------------------------------------------ */

/* First SIGINT/SIGTERM cancels every task (cleanups run); a second one only
 * says cleanup is under way; a third forces the exit. */
static void default_interrupt(int signum) {
  signal_count++;
  if (!signal_received) signal_received = signum;
  if (signal_count == 1) {
    eng_task_cancel_all();
  } else if (signal_count == 2) {
    fprintf(stderr, "\nengine: cleaning up; interrupt again to exit at once\n");
  } else {
    fprintf(stderr, "\nengine: exiting without cleanup\n");
    _exit(128 + signum);
  }
}

static void signal_cb(struct ev_loop *l, ev_signal *w, int revents) {
  (void)l; (void)revents;
  if (interrupt_ref == LUA_NOREF || w->signum != SIGINT) {
    default_interrupt(w->signum);
    return;
  }
  lua_rawgeti(main_L, LUA_REGISTRYINDEX, interrupt_ref);
  if (eng_pcall(main_L, 0, 0) != LUA_OK) {
    fprintf(stderr, "engine: interrupt handler: %s\n", lua_tostring(main_L, -1));
    lua_pop(main_L, 1);
  }
}

/* engine.on_interrupt(fn | nil): fn replaces the default Ctrl-C behaviour. */
static int l_on_interrupt(lua_State *L) {
  luaL_unref(L, LUA_REGISTRYINDEX, interrupt_ref);
  interrupt_ref = LUA_NOREF;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_pushvalue(L, 1);
    interrupt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return 0;
}

/* engine.signal() -> the signal number that interrupted the run, or nil */
static int l_signal(lua_State *L) {
  if (!signal_received) return 0;
  lua_pushinteger(L, signal_received);
  return 1;
}

/* engine.cancel_all(): what the first Ctrl-C does, without the signal. */
static int l_cancel_all(lua_State *L) {
  (void)L;
  eng_task_cancel_all();
  return 0;
}

/* engine.live_tasks() -> number of unfinished tasks */
static int l_live_tasks(lua_State *L) {
  lua_pushinteger(L, eng_task_live());
  return 1;
}

void eng_loop_init(lua_State *L) {
  main_L = L;
  loop = ev_default_loop(EVFLAG_AUTO);
  if (!loop) {
    fprintf(stderr, "engine: cannot initialise the event loop\n");
    exit(1);
  }
  ev_signal_init(&sigint_watcher, signal_cb, SIGINT);
  ev_signal_init(&sigterm_watcher, signal_cb, SIGTERM);
  ev_signal_start(loop, &sigint_watcher);
  ev_signal_start(loop, &sigterm_watcher);
  ev_unref(loop);                  /* signals alone do not keep the loop alive */
  ev_unref(loop);
  signal(SIGPIPE, SIG_IGN);
  luaL_newmetatable(L, DEADLINE_MT);
  lua_pushcfunction(L, deadline_cancel);
  lua_setfield(L, -2, "cancel");
  lua_pushvalue(L, -1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, deadline_cancel);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}

static const luaL_Reg loop_funcs[] = {
  {"sleep", l_sleep}, {"now", l_now}, {"monotonic", l_monotonic},
  {"deadline", l_deadline}, {"on_interrupt", l_on_interrupt},
  {"signal", l_signal}, {"live_tasks", l_live_tasks},
  {"cancel_all", l_cancel_all}, {NULL, NULL}
};

/* require "engine.core": the C half of the root module. */
int luaopen_engine_core(lua_State *L) {
  luaL_newlib(L, loop_funcs);
  eng_task_open(L);
  lua_pushliteral(L, ENGINE_VERSION);
  lua_setfield(L, -2, "version");
  lua_pushstring(L, eng_root);
  lua_setfield(L, -2, "root");
  return 1;
}
