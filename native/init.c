/*
 * llfabric-init: a minimal pid 1 for a worker in its own PID namespace.
 *
 *   llfabric-init [--pidns [--proc [--adopt]] | --in PID] PROGRAM [ARGS...]
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
 * --proc gives the namespace a mount namespace of its own (a slave of the caller's: mounts made
 * outside still show inside) with its own /proc, in which pids are the namespace's: CUDA cannot
 * initialize where /proc is another namespace's.
 *
 * --adopt (with --proc): PROGRAM is a restorer (CRIU restoring a tree as its sibling); once it
 * has exited with status 0, the init's one child left, the restored tree's root, is the program
 * it waits for and forwards signals to (those that came meanwhile too: they were meant for the
 * tree, not its restorer). Restored in a namespace of its own, the tree gets back the pids it
 * had, whatever the host's processes hold.
 *
 * --in PID runs PROGRAM in the PID and mount namespaces of process PID (CRIU dumping a process
 * of a namespace it is not the init of, from inside), and exits with its status.
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
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
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

/* The one child of this process, or 0 if it has none or several. */
static pid_t only_child(void)
{
	char path[64];
	long first, second;
	int found;
	FILE *children;

	snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
	children = fopen(path, "r");
	if (children == NULL)
		die(path);
	found = fscanf(children, "%ld %ld", &first, &second);
	fclose(children);
	return found == 1 ? (pid_t)first : 0;
}

/*
 * Wait for `child`, reaping everything else, forwarding signals; return its status code. With
 * `adopt`, a child that exits with status 0 hands over to the one child left (see --adopt);
 * the signals received until then are the adopted child's, sent to it once it is.
 */
static int supervise(pid_t child, const sigset_t *set, int adopt)
{
	sigset_t deferred;

	sigemptyset(&deferred);
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
			if (adopt)
				sigaddset(&deferred, sig);
			else
				kill(child, sig);
			continue;
		}
		for (;;) {
			int status;
			pid_t pid = waitpid(-1, &status, WNOHANG);

			if (pid <= 0)
				break;
			if (pid != child)
				continue;
			if (adopt && status_code(status) == 0 && (child = only_child()) > 0) {
				adopt = 0;
				for (sig = 1; sig < NSIG; sig++)
					if (sigismember(&deferred, sig) == 1)
						kill(child, sig);
				continue;
			}
			return status_code(status);
		}
	}
}

/* A mount namespace of our own, a slave of the caller's, with a /proc of our PID namespace. */
static void own_proc(void)
{
	if (unshare(CLONE_NEWNS) < 0)
		die("unshare(CLONE_NEWNS)");
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		die("mount(/, MS_SLAVE)");
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		die("mount(/proc)");
}

/* Join the PID and mount namespaces of `pid` (children enter the PID namespace). */
static void enter(const char *pid)
{
	char path[64];
	int pidns, mntns;

	snprintf(path, sizeof(path), "/proc/%s/ns/pid", pid);
	pidns = open(path, O_RDONLY | O_CLOEXEC);
	snprintf(path, sizeof(path), "/proc/%s/ns/mnt", pid);
	mntns = open(path, O_RDONLY | O_CLOEXEC);
	if (pidns < 0 || mntns < 0)
		die(path);
	if (setns(pidns, CLONE_NEWPID) < 0)
		die("setns(CLONE_NEWPID)");
	if (setns(mntns, CLONE_NEWNS) < 0)
		die("setns(CLONE_NEWNS)");
	close(pidns);
	close(mntns);
}

static int usage(void)
{
	fprintf(stderr, "usage: llfabric-init [--pidns [--proc [--adopt]] | --in PID] "
		"PROGRAM [ARGS...]\n");
	return 2;
}

int main(int argc, char **argv)
{
	sigset_t set, old;
	int first = 1, pidns = 0, proc = 0, adopt = 0;
	const char *in = NULL;

	for (; first < argc && strncmp(argv[first], "--", 2) == 0; first++) {
		if (strcmp(argv[first], "--pidns") == 0)
			pidns = 1;
		else if (strcmp(argv[first], "--proc") == 0)
			proc = 1;
		else if (strcmp(argv[first], "--adopt") == 0)
			adopt = 1;
		else if (strcmp(argv[first], "--in") == 0 && first + 1 < argc)
			in = argv[++first];
		else
			return usage();
	}
	if (argc <= first || (proc && !pidns) || (adopt && !proc) || (in && pidns))
		return usage();
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		die("prctl(PR_SET_PDEATHSIG)");
	blocked_set(&set);
	if (sigprocmask(SIG_BLOCK, &set, &old) < 0)
		die("sigprocmask");

	if (in != NULL)
		enter(in);
	if (pidns) {
		pid_t init;

		if (unshare(CLONE_NEWPID) < 0)
			die("unshare(CLONE_NEWPID)");
		init = fork();
		if (init < 0)
			die("fork");
		if (init > 0)
			return supervise(init, &set, 0);
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
			die("prctl(PR_SET_PDEATHSIG)");
		if (setsid() < 0)
			die("setsid");
		if (proc)
			own_proc();
	}
	if (getpid() != 1 && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		die("prctl(PR_SET_CHILD_SUBREAPER)");
	return supervise(spawn(argv + first, &old), &set, adopt);
}
