/*
 * A stand-in cuzk engine for the end-to-end swap tests, compiled by the tests with gcc.
 *
 * It has to be a real executable (not a script) so that /proc/PID/exe of a running engine is
 * the release binary itself, which is what the supervisor reports and the tests check.
 *
 *   fake_cuzk --version       print VERSION and exit 0
 *   fake_cuzk --port N        serve GET /status (a valid cuzk status document) and
 *                             GET /version (VERSION) on 127.0.0.1:N until SIGTERM (exit 0)
 *   anything else             exit 2
 *
 * Build: gcc -O1 -DVERSION='"v1"' [-DCRASH=1] -o fake_cuzk fake_cuzk.c
 * With CRASH=1 it exits 1 at start whatever the arguments: a release that cannot run.
 * With FAKE_CUZK_BROKEN=PATH in the environment it also exits 1 at start while the file PATH
 * holds exactly VERSION: a release that ran well once and fails now (a rollback target that
 * fails, for the tests of undoing a rollback).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef VERSION
#error "compile with -DVERSION='\"vN\"'"
#endif
#ifndef CRASH
#define CRASH 0
#endif

static const char STATUS[] =
    "{\"uptime_secs\":1.0,"
    "\"memory\":{\"total_bytes\":1,\"used_bytes\":0,\"available_bytes\":1},"
    "\"synthesis\":{\"max_concurrent\":1,\"active\":0},"
    "\"pipelines\":[],\"gpu_workers\":[],"
    "\"allocations\":{\"srs\":[],\"pce\":[]},"
    "\"counters\":{\"total_completed\":0,\"total_failed\":0,\"completed_by_kind\":{},"
    "\"failed_by_kind\":{},\"queue_depth\":0},"
    "\"buffers\":{\"synth_in_flight\":0,\"provers_in_flight\":0,\"aux_in_flight\":0,"
    "\"shells_in_flight\":0,\"pending_handles\":0}}";

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void respond(int conn) {
    char request[4096];
    ssize_t got = read(conn, request, sizeof request - 1);
    if (got <= 0)
        return;
    request[got] = '\0';
    const char *body = strncmp(request, "GET /version", 12) == 0 ? VERSION : STATUS;
    const char *type = body == STATUS ? "application/json" : "text/plain";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     type, strlen(body));
    if (write(conn, head, (size_t)n) == n)
        (void)!write(conn, body, strlen(body));
}

static int serve(int port) {
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    /* A restarted engine rebinds the port its predecessor's connections left in TIME_WAIT. */
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(sock, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(sock, 16) != 0) {
        perror("fake_cuzk: bind");
        return 1;
    }
    printf("fake_cuzk %s listening on 127.0.0.1:%d\n", VERSION, port);
    fflush(stdout);
    for (;;) {
        int conn = accept(sock, NULL, NULL);
        if (conn < 0)
            continue;
        respond(conn);
        close(conn);
    }
}

static int broken_now(void) {
    const char *path = getenv("FAKE_CUZK_BROKEN");
    char text[64] = "";
    FILE *file = path ? fopen(path, "r") : NULL;
    if (file == NULL)
        return 0;
    size_t got = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[got] = '\0';
    return strcmp(text, VERSION) == 0;
}

int main(int argc, char **argv) {
    if (CRASH || broken_now()) {
        fprintf(stderr, "fake_cuzk %s: crashing at start\n", VERSION);
        return 1;
    }
    signal(SIGTERM, on_term);
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("%s\n", VERSION);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--port") == 0)
        return serve(atoi(argv[2]));
    fprintf(stderr, "usage: %s --version | --port N\n", argv[0]);
    return 2;
}
