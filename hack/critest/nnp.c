#include <stdio.h>
#include <unistd.h>
int main(void) { printf("Effective uid: %d\n", (int)geteuid()); return 0; }
