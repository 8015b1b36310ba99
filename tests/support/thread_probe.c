/* Preloaded into the test programs of the ci stage (GDSKIT_THREAD_PROBE=ON): the first pthread_create of a
   process appends the program's path to $GDSKIT_THREAD_PROBE_OUT, so scripts/test.sh can check that every
   program that starts threads carries the ctest label the ThreadSanitizer stage runs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*create_fn)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);

static atomic_int recorded;

static void record(void) {
  const char* out = getenv("GDSKIT_THREAD_PROBE_OUT");
  char line[4097];
  ssize_t n;
  int fd;
  if (out == NULL || atomic_exchange(&recorded, 1)) return;
  n = readlink("/proc/self/exe", line, sizeof line - 1);
  if (n <= 0) return;
  line[n++] = '\n';
  /* One write of a line shorter than PIPE_BUF with O_APPEND: lines of parallel tests do not interleave. */
  fd = open(out, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) < 0) {
    /* Nothing to report it to: the test's own output must stay the test's. */
  }
  close(fd);
}

int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg) {
  static create_fn real;
  if (real == NULL) real = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
  record();
  return real(thread, attr, start, arg);
}
