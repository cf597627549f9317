// Test-only fault kernels for tests/faults_cuda.py (issue 6): each misbehaves on purpose.
extern "C" __global__ void illegal_address(float* out) {
    float* wild = (float*)(0x10ull + 4096ull * (unsigned long long)threadIdx.x);
    *wild = out[0];
}
extern "C" __global__ void hang(float* out, int n, int stride) {
    for (int i = threadIdx.x; i < n; i += stride) out[0] += 1.0f;  // stride 0: forever
}
extern "C" __global__ void store_past_end(unsigned short* out, long long n) {
    out[n] = out[n - 1];  // the bounds check a last block forgot
}
extern "C" __global__ void fill_bits(unsigned short* out, long long n, unsigned short bits) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bits;
}
// Row sums of squares: warps reduce in order, then add their partials with atomicAdd after a
// pause drawn from the global timer, so the order of the float additions changes run to run.
extern "C" __global__ void racy_sum_squares(const float* x, float* ss, int n) {
    int row = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[(long long)row * n + i] : 0.0f;
    float p = v * v;
    for (int o = 16; o > 0; o >>= 1) p += __shfl_down_sync(0xffffffffu, p, o);
    if ((threadIdx.x & 31) == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        __nanosleep((unsigned)(((t >> 5) ^ (threadIdx.x * 40503u + blockIdx.x * 977u)) % 4000u));
        atomicAdd(ss + row, p);
    }
}
extern "C" __global__ void scale_rows(const float* x, const float* w, const float* ss, float* out,
                                      int n, float eps) {
    int row = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[(long long)row * n + i] = x[(long long)row * n + i]
                                             * rsqrtf(ss[row] / (float)n + eps) * w[i];
}
