// Thread stacks big enough for this process's static TLS.
//
// glibc carves a thread's static TLS out of its stack, and the CUDA libraries that libtorch_cuda
// loads bring about 190 KB of it (cuBLASLt alone 94 KB). A library that asks for a small stack
// then cannot start threads at all: civetweb (under prometheus-cpp's /metrics endpoint) asks for
// 100 KB and pthread_create fails with EINVAL ("Cannot create threads"). The spes binary defines
// pthread_attr_setstacksize (exported: CMakeLists.txt) so that every request gets at least 1 MiB
// on top of what was asked for being too small; larger requests pass unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {
constexpr std::size_t kMinThreadStack = 1 << 20;
using SetStackSize = int (*)(pthread_attr_t*, std::size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, std::size_t size) {
  static const auto real = reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, std::max(size, kMinThreadStack));
}
