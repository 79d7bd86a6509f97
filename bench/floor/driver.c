// driver.c: what the CUDA driver alone costs a fresh process on this host,
// the floor under forge's "context current" time. It loads libcuda,
// initialises it, makes a context and one allocation, printing the time of
// each step from main. Build and run on the GPU machine:
//
//   cc -O2 -o /tmp/driver bench/floor/driver.c -ldl && /tmp/driver
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
  double t0 = ms();
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  double t1 = ms();
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
  int (*devGet)(int *, int) = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
  int (*ctxCreate)(void **, unsigned, int) = (int (*)(void **, unsigned, int))dlsym(lib, "cuCtxCreate_v2");
  int (*memAlloc)(unsigned long long *, size_t) = (int (*)(unsigned long long *, size_t))dlsym(lib, "cuMemAlloc_v2");
  int r = init(0);
  double t2 = ms();
  int dev = 0;
  void *ctx = 0;
  if (!r) r = devGet(&dev, 0);
  if (!r) r = ctxCreate(&ctx, 0, dev);
  double t3 = ms();
  unsigned long long p = 0;
  if (!r) r = memAlloc(&p, 1 << 20);
  double t4 = ms();
  printf("driver floor: dlopen %.1f ms, cuInit %.1f ms, cuCtxCreate %.1f ms, first cuMemAlloc %.1f ms; context current %.1f ms from main (result %d)\n",
         t1 - t0, t2 - t1, t3 - t2, t4 - t3, t3 - t0, r);
  fflush(stdout);
  _exit(r); // the context's teardown is not part of the floor
}
