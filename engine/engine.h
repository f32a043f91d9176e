/*
 * engine.h: what the C modules share. The scheduler (task.c) and the loop
 * (loop.c) are the only global state; every other module talks to them
 * through the functions below.
 *
 * A blocking primitive follows one pattern:
 *
 *   static int l_sleep(lua_State *L) {
 *     double s = luaL_checknumber(L, 1);
 *     eng_task *t = eng_task_current(L);
 *     if (!t) return eng_task_block(L, l_sleep);   // outside a task
 *     ... allocate op, arm a watcher whose callback calls eng_task_wake ...
 *     return eng_task_yield(L, sleep_cleanup, op);
 *   }
 *
 * The watcher callback pushes its results onto eng_task_thread(t) and calls
 * eng_task_wake(t, nresults); the task then resumes inside the primitive and
 * those values are its return values. If the task is cancelled or
 * interrupted first, the cleanup runs instead (and the callback never does).
 * Where the task's thread cannot yield (a metamethod called from C, a sort
 * comparator...), eng_task_yield runs the cleanup at once and raises: arm
 * nothing the cleanup would not undo.
 */
#ifndef ENGINE_H
#define ENGINE_H

#include <lua.h>
#include <lauxlib.h>
#include <ev.h>

#define ENGINE_VERSION "0.1.0"

typedef struct eng_task eng_task;
typedef void (*eng_cleanup_fn)(void *data);

/* loop.c */
struct ev_loop *eng_loop(void);
void eng_loop_init(lua_State *L);
int eng_loop_signal(void);            /* 0, or SIGINT/SIGTERM once received */
int luaopen_engine_core(lua_State *L);

/* task.c */
void eng_task_init(lua_State *L);
eng_task *eng_task_current(lua_State *L);
lua_State *eng_task_thread(eng_task *t);
void eng_task_push(lua_State *L, eng_task *t);   /* [-0, +1, -] */
int eng_task_yield(lua_State *L, eng_cleanup_fn cleanup, void *data);
void eng_task_wake(eng_task *t, int nresults);
void eng_task_interrupt(eng_task *t, lua_State *L, int idx);
int eng_task_block(lua_State *L, lua_CFunction fn);
void eng_task_cancel_all(void);
int eng_task_live(void);
void eng_task_run_ready(void);
void eng_task_open(lua_State *L);

/* main.c / modules.c */
extern char eng_root[];               /* where lua/, envs/, providers/ live */
void eng_modules_preload(lua_State *L);
int eng_traceback(lua_State *L);      /* message handler for lua_pcall */
int eng_pcall(lua_State *L, int nargs, int nresults);

/* Pushes a fail result: nil, msg. Returns 2. [-0, +2, -] */
int eng_fail(lua_State *L, const char *msg);

#endif
