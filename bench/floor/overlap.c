// overlap.c: do the other things a fresh forge process does right after
// the GPU context exists hold its weight copies back? One thread streams
// 4 MiB host-to-device copies out of a pinned ring of 16 buffers (as
// actors.DeviceUploader does) while the main thread, in turn, loads the
// kernel modules given on the command line (forge's cached cubins: a
// 32-byte checksum, then the cubin) with the copies running, then paused,
// then paused while 8 threads page in FILE (MADV_POPULATE_READ, as forge's
// readers do), dlopens cuBLAS, makes a handle and runs its first GEMM,
// with quiet windows between. It prints each step's time, the copy rate
// and the longest gap between finished copies in each window.
//
//   cc -O2 -I/usr/local/cuda/include -o /tmp/overlap bench/floor/overlap.c -lcuda -ldl -lpthread
//   /tmp/overlap FILE ~/.cache/forge/kernels/*
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { SLOTS = 16, CHUNK = 4 << 20, DEVBUFS = 256, MAXDONE = 1 << 20 };

static double ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static CUcontext ctx;
static char *host; // the pinned ring the copies read
static volatile int stop, pause_copies, populating;
static double done[MAXDONE]; // when each copy was seen finished
static int ndone;

static void check(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "%s: error %d\n", what, r);
    exit(1);
  }
}

static void *copier(void *arg) {
  (void)arg;
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  CUstream s;
  check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  check(cuMemHostAlloc((void **)&host, (size_t)SLOTS * CHUNK, 0), "cuMemHostAlloc");
  memset(host, 1, (size_t)SLOTS * CHUNK);
  CUdeviceptr dev;
  check(cuMemAlloc(&dev, (size_t)DEVBUFS * CHUNK), "cuMemAlloc");
  CUevent ev[SLOTS];
  for (int i = 0; i < SLOTS; i++) check(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  long k = 0;
  while (!stop && ndone < MAXDONE) {
    if (pause_copies) {
      cuStreamSynchronize(s);
      usleep(100);
      continue;
    }
    int slot = k % SLOTS;
    if (k >= SLOTS) {
      check(cuEventSynchronize(ev[slot]), "cuEventSynchronize");
      done[ndone++] = ms();
    }
    check(cuMemcpyHtoDAsync(dev + (k % DEVBUFS) * (CUdeviceptr)CHUNK, (char *)host + (size_t)slot * CHUNK, CHUNK, s), "cuMemcpyHtoDAsync");
    check(cuEventRecord(ev[slot], s), "cuEventRecord");
    k++;
  }
  cuStreamSynchronize(s);
  return 0;
}

static char *filemap;
static size_t filelen;

// populater pages in its share of the file in 4 MiB chunks and drops the
// page-table entries again (the pages stay cached), until told to stop.
static void *populater(void *arg) {
  long id = (long)arg;
  while (populating) {
    for (size_t off = (size_t)id * CHUNK; off + CHUNK <= filelen && populating; off += 8 * (size_t)CHUNK) {
      madvise(filemap + off, CHUNK, 22 /* MADV_POPULATE_READ */);
      madvise(filemap + off, CHUNK, MADV_DONTNEED);
    }
  }
  return 0;
}

// stager copies file chunks into ring slots (as forge's stagers do,
// without waiting for the copies: this measures rates, not data) until
// told to stop, counting bytes.
static volatile int staging;
static long staged[8];

static void *stager(void *arg) {
  long id = (long)arg;
  size_t off = (size_t)id * CHUNK;
  for (int slot = id; staging; slot = (slot + 8) % SLOTS) {
    if (off + CHUNK > filelen) off = (size_t)id * CHUNK;
    memcpy(host + (size_t)slot * CHUNK, filemap + off, CHUNK);
    staged[id] += CHUNK;
    off += 8 * (size_t)CHUNK;
  }
  return 0;
}

// stage runs 8 stagers for ms milliseconds and returns their GB/s.
static double stage(int ms_) {
  pthread_t th[8];
  for (int i = 0; i < 8; i++) staged[i] = 0;
  staging = 1;
  for (long i = 0; i < 8; i++) pthread_create(&th[i], 0, stager, (void *)i);
  usleep(ms_ * 1000);
  staging = 0;
  long n = 0;
  for (int i = 0; i < 8; i++) pthread_join(th[i], 0), n += staged[i];
  return n / (ms_ / 1e3) / 1e9;
}

// report prints the copies finished in [a, b).
static void report(const char *what, double a, double b, double took) {
  int n = 0;
  double last = a, gap = 0;
  for (int i = 0; i < ndone; i++) {
    if (done[i] < a || done[i] >= b) continue;
    n++;
    if (done[i] - last > gap) gap = done[i] - last;
    last = done[i];
  }
  if (b - last > gap) gap = b - last;
  printf("  %-20s %7.1f ms  copies %6.1f GB/s  longest gap %6.1f ms\n", what, took,
         n * (double)CHUNK / ((b - a) / 1e3) / 1e9, gap);
}

static CUmodule mods[64];
static int nm;
static long mbytes;

// load loads every cubin on the command line; unload drops them again.
static void load(int argc, char **argv) {
  nm = 0, mbytes = 0;
  for (int i = 2; i < argc && nm < 64; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) continue;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *img = malloc(n + 1);
    if (fread(img, 1, n, f) != (size_t)n) n = 0;
    fclose(f);
    if (n > 32 && cuModuleLoadData(&mods[nm], img + 32) == CUDA_SUCCESS) nm++, mbytes += n - 32;
    free(img);
  }
}

static void unload(void) {
  for (int i = 0; i < nm; i++) cuModuleUnload(mods[i]);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: overlap FILE [cubin...]\n");
    return 2;
  }
  int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    perror(argv[1]);
    return 1;
  }
  filelen = st.st_size;
  filemap = mmap(0, filelen, PROT_READ, MAP_SHARED, fd, 0);
  check(cuInit(0), "cuInit");
  CUdevice d;
  check(cuDeviceGet(&d, 0), "cuDeviceGet");
  check(cuDevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  pthread_t th;
  pthread_create(&th, 0, copier, 0);
  usleep(100000); // the ring and the copies are going

  double w[32];
  const char *name[16];
  double took[16];
  int nw = 0;
  double t;
#define BEGIN() (t = ms())
#define END(label) (name[nw] = label, took[nw] = ms() - t, w[2 * nw] = t, w[2 * nw + 1] = ms(), nw++)
#define QUIET()       \
  do {                \
    BEGIN();          \
    usleep(40000);    \
    END("quiet");     \
  } while (0)

  QUIET();
  BEGIN(), load(argc, argv), END("modules");
  unload();
  QUIET();
  pause_copies = 1;
  usleep(5000);
  BEGIN(), load(argc, argv), END("modules, no copies");
  unload();
  populating = 1;
  pthread_t pop[8];
  for (long i = 0; i < 8; i++) pthread_create(&pop[i], 0, populater, (void *)i);
  usleep(20000);
  BEGIN(), load(argc, argv), END("modules, populate");
  populating = 0;
  for (int i = 0; i < 8; i++) pthread_join(pop[i], 0);
  // Staging alone, then beside the copies (forge's whole path).
  double alone = stage(200);
  pause_copies = 0;
  QUIET();
  double both;
  BEGIN(), both = stage(200), END("staging + copies");
  QUIET();

  BEGIN();
  const char *libs[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12"};
  void *blas = 0;
  for (int i = 0; i < 3 && !blas; i++) blas = dlopen(libs[i], RTLD_NOW | RTLD_GLOBAL);
  END("cuBLAS dlopen");
  QUIET();

  BEGIN();
  void *h = 0;
  int (*create)(void **) = blas ? (int (*)(void **))dlsym(blas, "cublasCreate_v2") : 0;
  int cr = create ? create(&h) : -1;
  END("cublasCreate");
  QUIET();

  // The first GEMM loads cuBLAS's kernel: 256 x 256 x 256 in float.
  BEGIN();
  int (*sgemm)(void *, int, int, int, int, int, const float *, const void *, int, const void *, int, const float *, void *, int) =
      blas ? (int (*)(void *, int, int, int, int, int, const float *, const void *, int, const void *, int, const float *, void *, int))dlsym(blas, "cublasSgemm_v2") : 0;
  CUdeviceptr a = 0;
  int gr = -1;
  if (sgemm && cr == 0 && cuMemAlloc(&a, 3 * 256 * 256 * 4) == CUDA_SUCCESS) {
    float one = 1, zero = 0;
    gr = sgemm(h, 0, 0, 256, 256, 256, &one, (void *)a, 256, (void *)(a + 256 * 256 * 4), 256, &zero, (void *)(a + 2 * 256 * 256 * 4), 256);
    cuCtxSynchronize();
  }
  END("first GEMM");
  QUIET();

  stop = 1;
  pthread_join(th, 0);
  const char *ml = getenv("CUDA_MODULE_LOADING");
  printf("overlap (CUDA_MODULE_LOADING=%s): %d modules (%ld bytes), cuBLAS %s, cublasCreate %d, first GEMM %d\n",
         ml ? ml : "unset", nm, mbytes, blas ? "loaded" : "missing", cr, gr);
  for (int i = 0; i < nw; i++) report(name[i], w[2 * i], w[2 * i + 1], took[i]);
  printf("  8 stagers (memcpy from the mapped file into the pinned ring): %.1f GB/s alone, %.1f GB/s beside the copies\n", alone, both);
  return 0;
}
