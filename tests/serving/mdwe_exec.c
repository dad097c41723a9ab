/* mdwe_exec.c - run $PD_MDWE_EXEC (argv passed on) under
 * prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN): no memory may become
 * writable and executable, what systemd's MemoryDenyWriteExecute=yes
 * enforces (PCRE2's JIT fails there, -48). Inherited across exec. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

int main(int argc, char **argv)
{
    const char *real = getenv("PD_MDWE_EXEC");
    (void)argc;
    if (real == NULL) {
        fprintf(stderr, "mdwe-exec: PD_MDWE_EXEC is not set\n");
        return 126;
    }
    if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) != 0) {
        perror("mdwe-exec: prctl(PR_SET_MDWE)");
        return 126;
    }
    argv[0] = (char *)real;
    execv(real, argv);
    perror("mdwe-exec: execv");
    return 127;
}
