/*
 * llfabric-init: a minimal pid 1 for a worker in its own PID namespace.
 *
 *   llfabric-init [--pidns] PROGRAM [ARGS...]
 *
 * It forks PROGRAM, forwards the signals it receives to it, reaps every process of the namespace
 * (orphans included), and exits once PROGRAM has: with its exit code, or 128 + the signal that
 * killed it (a pid 1 cannot be killed by its own signal, so the status is passed on that way).
 *
 * With --pidns it first creates the namespace: it unshares CLONE_NEWPID and forks; the child is
 * pid 1 of the new namespace and runs as above, in a new session (so that CRIU can dump the tree
 * rooted at it), while the caller's process waits for it, forwards signals to it and exits with
 * its status. That outer process is only there when the namespace is created; a CRIU restore
 * recreates the namespace with the init as its root, a direct child of the restorer.
 *
 * Outside a namespace of its own (no --pidns, not pid 1) it makes itself a child subreaper, so
 * that orphans of PROGRAM are still reaped here.
 *
 * It keeps no descriptor beyond stdio once PROGRAM is started (PROGRAM inherits them all): a
 * descriptor it held would keep a peer waiting for EOF and would be dumped with it. It dies
 * with its parent (PR_SET_PDEATHSIG), so a server that goes away takes its workers along.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "llfabric-init: %s: %s\n", what, strerror(errno));
	_exit(127);
}

static int status_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

/*
 * Every signal except those that cannot be caught or that concern the caller's own faults is
 * blocked and taken synchronously with sigwaitinfo: no handlers, no races with fork.
 */
static void blocked_set(sigset_t *set)
{
	sigfillset(set);
	sigdelset(set, SIGKILL);
	sigdelset(set, SIGSTOP);
	sigdelset(set, SIGSEGV);
	sigdelset(set, SIGBUS);
	sigdelset(set, SIGFPE);
	sigdelset(set, SIGILL);
	sigdelset(set, SIGABRT);
	sigdelset(set, SIGTRAP);
	sigdelset(set, SIGSYS);
}

/* Fork `argv`, with the signal mask it would have had without us; return its pid. */
static pid_t spawn(char **argv, const sigset_t *old)
{
	pid_t pid = fork();

	if (pid < 0)
		die("fork");
	if (pid == 0) {
		sigprocmask(SIG_SETMASK, old, NULL);
		execvp(argv[0], argv);
		die(argv[0]);
	}
	return pid;
}

/* Wait for `child`, reaping everything else, forwarding signals; return its status code. */
static int supervise(pid_t child, const sigset_t *set)
{
	closefrom(3);
	for (;;) {
		siginfo_t info;
		int sig = sigwaitinfo(set, &info);

		if (sig < 0) {
			if (errno == EINTR)
				continue;
			die("sigwaitinfo");
		}
		if (sig != SIGCHLD) {
			kill(child, sig);
			continue;
		}
		for (;;) {
			int status;
			pid_t pid = waitpid(-1, &status, WNOHANG);

			if (pid <= 0)
				break;
			if (pid == child)
				return status_code(status);
		}
	}
}

int main(int argc, char **argv)
{
	sigset_t set, old;
	int first = 1;

	if (argc > 1 && strcmp(argv[1], "--pidns") == 0)
		first = 2;
	if (argc <= first) {
		fprintf(stderr, "usage: llfabric-init [--pidns] PROGRAM [ARGS...]\n");
		return 2;
	}
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		die("prctl(PR_SET_PDEATHSIG)");
	blocked_set(&set);
	if (sigprocmask(SIG_BLOCK, &set, &old) < 0)
		die("sigprocmask");

	if (first == 2) {
		pid_t init;

		if (unshare(CLONE_NEWPID) < 0)
			die("unshare(CLONE_NEWPID)");
		init = fork();
		if (init < 0)
			die("fork");
		if (init > 0)
			return supervise(init, &set);
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
			die("prctl(PR_SET_PDEATHSIG)");
		if (setsid() < 0)
			die("setsid");
	}
	if (getpid() != 1 && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		die("prctl(PR_SET_CHILD_SUBREAPER)");
	return supervise(spawn(argv + first, &old), &set);
}
