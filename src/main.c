// wren: a local inference engine for Qwen3.5/3.6 hybrid MoE models.
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate a reply to one prompt, streamed"},
    {"chat", cmd_chat, "interactive multi-turn chat in the terminal"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench", cmd_bench, "prefill and decode speed at given lengths"},
    {"logits", cmd_logits, "teacher-forced logits of a token sequence"},
    {"perplexity", cmd_perplexity, "perplexity of a token sequence or text"},
    {"synth", cmd_synth, "write a random-weight checkpoint with real shapes"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"template", cmd_template, "render a chat request into the prompt text"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: wren COMMAND [options]   (wren COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "wren: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
