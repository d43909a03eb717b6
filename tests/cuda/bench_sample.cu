// What a token's sampling costs on the GPU, per path: the greedy argmax, the candidate kernel
// (top-k 20 with top-p 0.95, the Qwen models' defaults; top-k 64 with min-p; greedy with logprobs;
// top-p without top-k; temperature alone) and the one-block kernel on the same calls. Each path
// runs 100 times in a captured graph, as in the decode step (programmatic launch where the card has
// it), over logits shaped like a trained model's (a few hundred plausible ids well above a Gaussian
// bulk) and over the bulk alone, as a random model's flat logits (where top-p and min-p without
// top-k keep thousands of ids, and the candidate kernel selects over all its blocks).
// usage: bench_sample [vocab]
#include "common_check.cuh"

int main(int argc, char **argv) {
    init_device();
    const int V = argc > 1 ? atoi(argv[1]) : 248320;
    if (V < 64) return fprintf(stderr, "bench_sample: vocab must be at least 64\n"), 2;
    std::vector<float> flat(V);
    for (int i = 0; i < V; i++) flat[i] = rnd_f(-1.f, 1.f) + rnd_f(-1.f, 1.f) + rnd_f(-1.f, 1.f);
    std::vector<float> l = flat;
    for (int i = 0; i < 300; i++) l[rnd_u32() % V] += rnd_f(4.f, 12.f);
    float *logits, *work;
    int *counts, *step, *pos, *tok;
    uint8_t *seen;
    unsigned long long *amax;
    unsigned *counter;
    struct sampled_token *ring, *ring_dev;
    CK(cudaMalloc(&logits, V * 4));
    CK(cudaMalloc(&work, sample_work_bytes(V)));
    CK(cudaMalloc(&counts, V * 4));
    CK(cudaMalloc(&seen, V));
    CK(cudaMalloc(&step, 4));
    CK(cudaMalloc(&pos, 4));
    CK(cudaMalloc(&tok, 4));
    CK(cudaMalloc(&amax, 8));
    CK(cudaMalloc(&counter, 4));
    CK(cudaMemcpy(logits, l.data(), V * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(counts, 0, V * 4));
    CK(cudaMemset(seen, 0, V));
    CK(cudaMemset(step, 0, 4));
    CK(cudaMemset(amax, 0, 8));
    CK(cudaMemset(counter, 0, 4));
    CK(cudaHostAlloc((void **)&ring, 8 * sizeof(struct sampled_token), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&ring_dev, ring, 0));
    struct sample_params p;
    memset(&p, 0, sizeof p);
    p.logits = logits, p.n_vocab = V, p.top_p = 1, p.repetition = 1, p.n_logprobs = -1;
    p.counts = counts, p.seen = seen, p.work = work, p.argmax = amax, p.counter = counter;
    p.tok_out = tok, p.step = step, p.pos = pos, p.ring = ring_dev, p.ring_n = 8, p.seed = 5;
    struct {
        const char *name;
        float temp, top_p, min_p;
        int top_k, n_logprobs;
    } runs[] = {
        {"greedy (argmax)", 0.f, 1.f, 0.f, 0, -1},
        {"greedy + 5 logprobs", 0.f, 1.f, 0.f, 0, 5},
        {"temperature 1, top-k 20, top-p 0.95", 1.f, 0.95f, 0.f, 20, -1},
        {"temperature 0.7, top-k 64, min-p 0.05", 0.7f, 1.f, 0.05f, 64, -1},
        {"temperature 0.7, top-p 0.9 (no top-k)", 0.7f, 0.9f, 0.f, 0, -1},
        {"temperature 1 (no truncation)", 1.f, 1.f, 0.f, 0, -1},
        {"temperature 1, min-p 0.1 (no top-k)", 1.f, 1.f, 0.1f, 0, -1},
    };
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("vocab %d, us per call (100 calls in a graph)\n", V);
    for (int shape = 0; shape < 2; shape++) {
        printf("%s logits\n", shape ? "flat" : "peaked");
        CK(cudaMemcpy(logits, (shape ? flat : l).data(), V * 4, cudaMemcpyHostToDevice));
        for (auto &r : runs) {
            for (int one = 0; one < 2; one++) {
                p.temperature = r.temp, p.top_p = r.top_p, p.min_p = r.min_p, p.top_k = r.top_k;
                p.n_logprobs = r.n_logprobs, p.one_block = one;
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
                for (int i = 0; i < 100; i++) WK(sample_launch(&p, s, &err_));
                CK(cudaStreamEndCapture(s, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphLaunch(ge, s)); // warm-up
                CK(cudaEventRecord(e0, s));
                CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaStreamSynchronize(s));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                printf("  %-42s %-10s %8.2f\n", r.name, one ? "one block" : "default", ms * 10.f);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
        }
    }
    return finish("bench_sample");
}
