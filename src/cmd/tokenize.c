// Placeholder until this command is implemented.
#include <stdio.h>

#include "cmd/cmd.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "wren tokenize: not implemented yet\n");
    return 2;
}
