// selftest.cu: kernels that check the emulator itself (emu_test.go's
// TestEmuSelf), built into the emulator only, after common.h.

// Half the lanes exit, the others read them through a shuffle: every such
// read is poisoned and counted.
KERNEL void st_exit_shfl(float* out) {
  int lane = threadIdx.x % warpSize;
  if (lane >= warpSize / 2) return;
  out[threadIdx.x] = SHFL_XOR(1.0f, warpSize / 2);
}

// Two branches shuffle within themselves (no poison), then the warp
// reconverges and every lane takes part in a full-warp sum.
KERNEL void st_diverge(int* out) {
  int lane = threadIdx.x % warpSize;
  int v = lane;
  if (lane < warpSize / 2) {
    v += SHFL_XOR(lane, 1);
  } else {
    v -= SHFL_XOR(lane, 2);
  }
  for (int o = warpSize / 2; o > 0; o >>= 1) v += SHFL_XOR(v, o);
  out[threadIdx.x] = v;
}

// Lanes exchange values through shared memory, without (sync = 0) and with
// (sync = 1) a WARP_SYNC between the write and the read.
KERNEL void st_lockstep(int* out, int sync) {
  __shared__ int s[64];
  int lane = threadIdx.x % warpSize;
  s[lane] = 0;
  if (sync) WARP_SYNC();
  s[lane] = lane + 100;
  if (sync) WARP_SYNC();
  out[threadIdx.x] = s[(lane + 1) % warpSize];
}

// A block-wide exchange through __syncthreads, and the warp size.
KERNEL void st_sync(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = threadIdx.x + blockIdx.x;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
  if (threadIdx.x == 0 && blockIdx.x == 0) out[gridDim.x * blockDim.x] = warpSize;
}
