// ThreadSanitizer's defaults for every binary built with --config=tsan
// (linked in beside Abseil's source build, Note [ThreadSanitizer and Abseil]
// in third_party/absl_source.BUILD). Compiled in rather than passed in
// TSAN_OPTIONS, so that the processes an end-to-end test starts (ranks,
// agents, the coordinator) get them as well; TSAN_OPTIONS still overrides.

// Stop at the first report, with both stacks of a deadlock. Memory that an
// uninstrumented library (gRPC, protobuf, libstdc++) copies through an
// intercepted call such as memcpy is not checked: those libraries hand their
// buffers between threads by means ThreadSanitizer cannot see.
extern "C" const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1:history_size=4:ignore_noninstrumented_modules=1";
}

// gRPC comes from Debian uninstrumented: its own memory accesses are
// invisible, but the file descriptors and system calls it uses are seen by
// ThreadSanitizer's interceptors, which then report "races" between gRPC's
// threads on its own epoll and event fds. A report with a frame in gRPC is not
// about Chorus' code.
//
// Abseil's per-thread semaphores live in memory its low-level allocator
// mmaps; GCC's ThreadSanitizer counts the mmap as a write that nothing
// orders before another thread's atomic wake-up through the Mutex's waiter
// queue. Only those two frames are exempt, not Mutex as a whole (a Condition
// that reads unguarded state must still be reported).
extern "C" const char* __tsan_default_suppressions() {
  return "race:absl::*synchronization_internal::Waiter::Post\n"
         "race:absl::*base_internal::LowLevelAlloc::Alloc\n"
         "race:libgrpc.so\n"
         "race:libgrpc++.so\n"
         "race:libgpr.so\n";
}
