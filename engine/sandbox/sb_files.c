/*
 * sb_files.c: engine.SandboxFile, a descriptor the supervisor opened inside
 * the sandbox and passed to the engine, and the host-side helpers that
 * sandbox.lua uses to copy whole trees.
 *
 * Path resolution never happens here for sandbox paths: the supervisor
 * resolved them inside the root. The engine only moves bytes, with
 * sendfile() between a host file and a sandbox file, so a 100 MB upload or
 * download never passes through Lua memory at all.
 */
#include "engine.h"
#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_MT "engine.SandboxFile"

typedef struct sfile { int fd; } sfile;

/* Short stable messages for the errors users can cause. */
const char *eng_sb_errmsg(int err) {
  switch (err) {
  case ENOENT: return "no such file";
  case EACCES: case EPERM: return "permission denied";
  case EISDIR: return "is a directory";
  case ENOTDIR: return "not a directory";
  case ENOSPC: case EDQUOT: return "no space left";
  case EEXIST: return "file exists";
  case ENOTEMPTY: return "directory not empty";
  case EROFS: return "read-only file system";
  case ELOOP: return "too many symlinks";
  case ENAMETOOLONG: return "name too long";
  case EINVAL: return "not a regular file";
  default: return strerror(err);
  }
}

static int fail_errno(lua_State *L, int err) {
  return eng_fail(L, eng_sb_errmsg(err));
}

void eng_sb_push_file(lua_State *L, int fd) {
  sfile *f = lua_newuserdatauv(L, sizeof *f, 0);
  f->fd = fd;
  luaL_setmetatable(L, FILE_MT);
}

static sfile *check_file(lua_State *L) {
  sfile *f = luaL_checkudata(L, 1, FILE_MT);
  if (f->fd < 0) luaL_error(L, "attempt to use a closed sandbox file");
  return f;
}

/* The one release: closes the descriptor once; never raises. */
static int file_close(lua_State *L) {
  sfile *f = luaL_checkudata(L, 1, FILE_MT);
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  return 0;
}

/* f:read_all() -> data | nil, err */
static int file_read_all(lua_State *L) {
  sfile *f = check_file(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (;;) {
    char *p = luaL_prepbuffsize(&b, 1 << 16);
    ssize_t n = read(f->fd, p, 1 << 16);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(L, errno);
    if (n == 0) break;
    luaL_addsize(&b, (size_t)n);
  }
  luaL_pushresult(&b);
  return 1;
}

static int write_all(int fd, const char *p, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* f:write(data) -> true | nil, err */
static int file_write(lua_State *L) {
  sfile *f = check_file(L);
  size_t len;
  const char *p = luaL_checklstring(L, 2, &len);
  if (write_all(f->fd, p, len) < 0) return fail_errno(L, errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* Copies in -> out in the kernel; returns bytes or -1. */
static long long pump(int in, int out) {
  long long total = 0;
  for (;;) {
    ssize_t n = sendfile(out, in, NULL, 1 << 24);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) return total;
    total += n;
  }
}

/* f:copy_from(host_path) -> bytes | nil, err */
static int file_copy_from(lua_State *L) {
  sfile *f = check_file(L);
  int in = open(luaL_checkstring(L, 2), O_RDONLY | O_CLOEXEC);
  if (in < 0) return fail_errno(L, errno);
  long long n = pump(in, f->fd);
  int e = errno;
  close(in);
  if (n < 0) return fail_errno(L, e);
  lua_pushinteger(L, n);
  return 1;
}

/* f:copy_to(host_path [, mode]) -> bytes | nil, err */
static int file_copy_to(lua_State *L) {
  sfile *f = check_file(L);
  mode_t mode = (mode_t)luaL_optinteger(L, 3, 0644);
  int out = open(luaL_checkstring(L, 2), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (out < 0) return fail_errno(L, errno);
  long long n = pump(f->fd, out);
  int e = errno;
  close(out);
  if (n < 0) return fail_errno(L, e);
  lua_pushinteger(L, n);
  return 1;
}

/* ---- host helpers ------------------------------------------------------- */

static char type_of(mode_t m) {
  return S_ISDIR(m) ? 'd' : S_ISREG(m) ? 'f' : S_ISLNK(m) ? 'l' : 'o';
}

/* host_stat(path) -> type ("d"/"f"/"l"/"o"), size, mode, mtime | nil, err */
static int host_stat(lua_State *L) {
  struct stat st;
  if (lstat(luaL_checkstring(L, 1), &st) < 0) return fail_errno(L, errno);
  char t = type_of(st.st_mode);
  lua_pushlstring(L, &t, 1);
  lua_pushinteger(L, st.st_size);
  lua_pushinteger(L, st.st_mode & 07777);
  lua_pushinteger(L, st.st_mtime);
  return 4;
}

/* host_list(path) -> {name, ...} | nil, err */
static int host_list(lua_State *L) {
  DIR *d = opendir(luaL_checkstring(L, 1));
  struct dirent *de;
  int i = 0;
  if (!d) return fail_errno(L, errno);
  lua_newtable(L);
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    lua_pushstring(L, de->d_name);
    lua_rawseti(L, -2, ++i);
  }
  closedir(d);
  return 1;
}

/* host_mkdir(path [, mode]) -> true | nil, err  (parents too) */
static int host_mkdir(lua_State *L) {
  char buf[PATH_MAX];
  mode_t mode = (mode_t)luaL_optinteger(L, 2, 0755);
  snprintf(buf, sizeof buf, "%s", luaL_checkstring(L, 1));
  for (char *p = buf + 1; (p = strchr(p, '/')); p++) {
    *p = 0;
    if (mkdir(buf, mode) < 0 && errno != EEXIST) return fail_errno(L, errno);
    *p = '/';
  }
  if (mkdir(buf, mode) < 0 && errno != EEXIST) return fail_errno(L, errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* host_rmtree(path) -> true | nil, err (a missing path is not an error) */
static int host_rmtree(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  if (eng_sb_remove_tree(AT_FDCWD, path) < 0 && errno != ENOENT)
    return fail_errno(L, errno);
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg file_methods[] = {
  {"read_all", file_read_all}, {"write", file_write}, {"copy_from", file_copy_from},
  {"copy_to", file_copy_to}, {"close", file_close}, {NULL, NULL}
};

static const luaL_Reg host_funcs[] = {
  {"host_stat", host_stat}, {"host_list", host_list}, {"host_mkdir", host_mkdir},
  {"host_rmtree", host_rmtree}, {NULL, NULL}
};

void eng_sb_files_open(lua_State *L) {
  if (luaL_newmetatable(L, FILE_MT)) {
    luaL_newlib(L, file_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, file_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, file_close);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  luaL_setfuncs(L, host_funcs, 0);
}
