// Test kernels for package rocm, compiled at run time by nvrtc (CUDA) and
// hiprtc (HIP). Both compilers predefine the built-ins used here
// (blockIdx, blockDim, threadIdx), so no header is needed; extern "C" keeps
// the names unmangled for ModuleGetFunction.

// y[i] = a*x[i] + y[i] for i < n.
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}

// out[i] = in[i] * 2 + 1, as 32-bit integers: checks a second kernel in the
// same module and an integer path.
extern "C" __global__ void affine_u32(const unsigned int* in, unsigned int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in[i] * 2u + 1u;
    }
}

// Does nothing: measures launch overhead.
extern "C" __global__ void empty(int n) {
    (void)n;
}
