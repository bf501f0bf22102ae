/* The pod sandbox's one process for the test node (hack/node-images.sh): it holds the pod's
 * namespaces, reaps what is re-parented to it and exits on SIGINT or SIGTERM. Built static, so
 * its image holds nothing else. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, 0, WNOHANG) > 0) {
	}
}

static void quit(int sig) {
	(void)sig;
	_exit(0);
}

int main(void) {
	signal(SIGINT, quit);
	signal(SIGTERM, quit);
	signal(SIGCHLD, reap);
	for (;;)
		pause();
}
