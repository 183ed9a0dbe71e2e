// A preloaded library (LD_PRELOAD) that fails any process which starts a
// thread: .ci/run runs the test targets tagged tsan_single_thread under it.
// ThreadSanitizer reports races between threads, so the tsan configuration
// leaves out tests that start none (.bazelrc); this keeps the tag honest. A
// test that comes to start a thread fails here with its name and the way
// out, instead of silently losing ThreadSanitizer's eye.
//
// It defines pthread_create, which a preloaded library may interpose for the
// whole process (std::thread, gRPC and gloo all start threads through it),
// and never calls the real one.

#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

extern "C" int pthread_create(pthread_t* /*thread*/, const pthread_attr_t* /*attributes*/,
                              void* (* /*start*/)(void*), void* /*argument*/) {
  char executable[4096] = "?";
  const ssize_t length = readlink("/proc/self/exe", executable, sizeof(executable) - 1);
  if (length > 0) executable[length] = '\0';
  const char* target = std::getenv("TEST_TARGET");
  std::fprintf(stderr,
               "thread_probe: %s (test %s) started a thread, but the test is tagged "
               "tsan_single_thread, which leaves it out of the ThreadSanitizer run. Remove "
               "the tag from its BUILD rule.\n",
               executable, target != nullptr ? target : "?");
  std::fflush(stderr);
  std::_Exit(86);
}
