// Placeholder until this command is implemented.
#include <stdio.h>

#include "cmd/cmd.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "wren bench: not implemented yet\n");
    return 2;
}
