/*
 * Loaded with LD_PRELOAD into a node process: fsync() and fdatasync() fail
 * with EIO while the file $RAFTCOORD_FAIL_FSYNC_DIR/<pid> exists, as a disk
 * that stopped writing would make them fail. Without the variable, or
 * without the file, the calls go to the C library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int failing(void) {
    const char *dir = getenv("RAFTCOORD_FAIL_FSYNC_DIR");
    char path[4096];
    struct stat st;
    if (dir == NULL)
        return 0;
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    return stat(path, &st) == 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing()) {
        errno = EIO;
        return -1;
    }
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing()) {
        errno = EIO;
        return -1;
    }
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
