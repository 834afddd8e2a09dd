/* A stand-in for the nginx test image: comm "nginx", a cmdline with "master process", a pid
 * file, and HTTP 200 on PORT (default 80). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
    if (strncmp(argv[0], "nginx:", 6) != 0) {
        char *a[] = {"nginx: master process nginx -g daemon off;", NULL};
        execv("/proc/self/exe", a);
        return 1;
    }
    FILE *f = fopen("/var/run/nginx.pid", "w");
    if (f) { fprintf(f, "%d\n", getpid()); fclose(f); }
    int port = getenv("PORT") ? atoi(getenv("PORT")) : 80;
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 16)) { perror("listen"); return 1; }
    const char *r = "HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<h1>Welcome to nginx!</h1>\n";
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        char buf[1024]; (void)read(c, buf, sizeof buf);
        (void)write(c, r, strlen(r)); close(c);
    }
}
