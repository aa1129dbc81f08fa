/*
 * Loaded with LD_PRELOAD into a node process to rehearse two bad days:
 *
 * - a dying disk: fsync() and fdatasync() fail with EIO while the file
 *   $RAFTCOORD_FAULTS_DIR/fsync-<pid> exists;
 * - a stepped wall clock: clock_gettime(CLOCK_REALTIME*) is shifted by the
 *   milliseconds written (as a decimal number) in
 *   $RAFTCOORD_FAULTS_DIR/clock-<pid>; the file is read again at most every
 *   20 ms of the monotonic clock, which is never shifted.
 *
 * Without the variable, or without the files, the calls go to the C library
 * unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void control_path(char *path, size_t size, const char *kind) {
    const char *dir = getenv("RAFTCOORD_FAULTS_DIR");
    if (dir == NULL)
        path[0] = '\0';
    else
        snprintf(path, size, "%s/%s-%d", dir, kind, (int)getpid());
}

static int fsync_failing(void) {
    char path[4096];
    struct stat st;
    control_path(path, sizeof path, "fsync");
    return path[0] != '\0' && stat(path, &st) == 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (fsync_failing()) {
        errno = EIO;
        return -1;
    }
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (fsync_failing()) {
        errno = EIO;
        return -1;
    }
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn real;
    if (real == NULL)
        real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return real;
}

/* The shift in nanoseconds; races between threads only re-read the file. */
static long long clock_shift_ns(void) {
    static long long shift_ns;
    static long long checked_ns = -1;
    struct timespec now;
    long long now_ns;
    char path[4096];
    FILE *file;
    long long ms = 0;

    if (real_clock_gettime()(CLOCK_MONOTONIC, &now) != 0)
        return shift_ns;
    now_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    if (checked_ns >= 0 && now_ns - checked_ns < 20000000LL)
        return shift_ns;
    checked_ns = now_ns;
    control_path(path, sizeof path, "clock");
    if (path[0] == '\0')
        return shift_ns = 0;
    file = fopen(path, "r");
    if (file == NULL)
        return shift_ns = 0;
    if (fscanf(file, "%lld", &ms) != 1)
        ms = 0;
    fclose(file);
    return shift_ns = ms * 1000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock_gettime()(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long total = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + clock_shift_ns();
        ts->tv_sec = (time_t)(total / 1000000000LL);
        ts->tv_nsec = (long)(total % 1000000000LL);
    }
    return rc;
}
