// A greedy run of llama.cpp (libllama) from given token ids, with what
// `cargo xtask bench llama-cpp` compares gkq-decode against: the prompt in
// one batch (llama.cpp's prefill), then one token at a time; the times from
// process start, the tokens, peak RSS and the first step's logits. Built
// against the libllama of the llama-cpp-python sdist by the bench:
//
//   llama_driver -m MODEL.gguf -t 2 -n 64 --ids 1,2,3 [--ignore-eos] [--logits-out FILE]
//
// One JSON object on stdout.
#include "llama.h"

#include <chrono>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

static long peak_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) {
            return std::stol(line.substr(6)) * 1024;
        }
    }
    return -1;
}

static void set_batch(llama_batch_ext * b, const llama_token * t, int n, llama_pos pos0) {
    llama_batch_ext_clear(b);
    for (int i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(b, 0, t[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(b, idx, &pos);
    }
    llama_batch_ext_set_output_logits(b, n - 1, true);
}

int main(int argc, char ** argv) {
    const auto started = std::chrono::steady_clock::now();
    std::setlocale(LC_NUMERIC, "C");
    std::string model_path, ids_arg, logits_out;
    int threads = 2, n_predict = 16;
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "-m") model_path = next();
        else if (a == "-t") threads = std::stoi(next());
        else if (a == "-n") n_predict = std::stoi(next());
        else if (a == "--ids") ids_arg = next();
        else if (a == "--logits-out") logits_out = next();
        else if (a == "--ignore-eos") ignore_eos = true;
        else { fprintf(stderr, "llama_driver: unknown argument %s\n", a.c_str()); return 2; }
    }
    std::vector<llama_token> prompt;
    std::stringstream ss(ids_arg);
    for (std::string tok; std::getline(ss, tok, ',');) prompt.push_back(std::stoi(tok));
    if (model_path.empty() || prompt.empty()) { fprintf(stderr, "llama_driver: -m MODEL --ids 1,2,3\n"); return 2; }

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) { fprintf(stderr, "llama_driver: cannot load %s\n", model_path.c_str()); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = prompt.size() + n_predict + 8;
    cp.n_batch = prompt.size();
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_driver: cannot make a context\n"); return 1; }
    const double load_ms = ms_since(started);

    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    set_batch(batch, prompt.data(), prompt.size(), 0);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> out;
    double prefill_ms = 0, ttft_ms = 0;
    auto t0 = std::chrono::steady_clock::now();
    auto t1 = t0;
    llama_pos pos = 0;
    int n_batch = prompt.size();
    for (int n = 0; n < n_predict; n++) {
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) { fprintf(stderr, "llama_driver: decode failed\n"); return 1; }
        pos += n_batch;
        const float * logits = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[best]) best = i;
        if (n == 0) {
            prefill_ms = ms_since(t0);
            ttft_ms = ms_since(started);
            t1 = std::chrono::steady_clock::now();
            if (!logits_out.empty()) {
                std::ofstream f(logits_out, std::ios::binary);
                f.write(reinterpret_cast<const char *>(logits), sizeof(float) * n_vocab);
            }
        }
        out.push_back(best);
        if (!ignore_eos && llama_vocab_is_eog(vocab, best)) break;
        set_batch(batch, &best, 1, pos);
        n_batch = 1;
    }
    const double gen_ms = ms_since(t1);
    printf("{\"prompt_tokens\": %zu, \"tokens\": [", prompt.size());
    for (size_t i = 0; i < out.size(); i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("], \"load_ms\": %.3f, \"prefill_ms\": %.3f, \"prefill_tokens_per_second\": %.3f, "
           "\"time_to_first_token_from_start_ms\": %.3f, \"tokens_per_second\": %.3f, \"peak_rss_bytes\": %ld, \"threads\": %d}\n",
           load_ms, prefill_ms, prompt.size() / (prefill_ms / 1e3), ttft_ms,
           out.size() > 1 ? (out.size() - 1) / (gen_ms / 1e3) : 0.0, peak_rss_bytes(), threads);
    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
