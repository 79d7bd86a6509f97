// Compile-only check (HIP): the device math library (ocml, from
// rocm-device-libs) and warp built-ins resolve through Debian's hiprtc.
extern "C" __global__ void softplus_warpsum(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = 0.0f;
    if (i < n) {
        v = logf(1.0f + expf(x[i])) * rsqrtf(1.0f + x[i] * x[i]);
    }
    for (int o = warpSize / 2; o > 0; o /= 2) {
        v += __shfl_xor(v, o);
    }
    if (i < n && (threadIdx.x % warpSize) == 0) {
        y[i / warpSize] = v;
    }
}
