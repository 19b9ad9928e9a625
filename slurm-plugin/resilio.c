/*
 * resilio's SPANK plugin: `srun --resilio[=key=value,...] CMD` runs every
 * task under a rank agent, `#SBATCH --resilio` runs the batch script under
 * the job level, with no `resilio run` in the command. See README.md.
 *
 * How a task is wrapped: slurm_spank_task_init runs in the task's process
 * after slurmstepd attached it to its cgroup and the task plugins bound it
 * (task_g_pre_launch), and before the task prolog, the user limits and the
 * execve of the task's argv. The plugin replaces argv[0] (the command's
 * absolute path) with resilio's and passes the command's path in the
 * task's environment (RESILIO_SPANK_EXEC); resilio rebuilds `resilio run
 * [flags] -- COMMAND ARGS...` from it. slurmstepd's own execve then runs
 * resilio with everything it set up: nothing is skipped.
 *
 * plugstack.conf: optional /usr/lib/resilio/resilio_spank.so \
 *                   resilio=/usr/bin/resilio [state_dir=/shared/resilio] [default=off|on]
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(resilio, 1);

#define OPTS_MAX 1024

static char resilio_bin[PATH_MAX] = "/usr/bin/resilio";
static char state_dir[PATH_MAX] = "";
static int default_on = 0;
/* -1: not given; 0: --resilio=off; 1: given. */
static int wanted = -1;
static char opts[OPTS_MAX] = "";

/* key=value,... : keys and values of letters, digits and . _ - / : only
 * (no shell, no spaces); resilio itself checks the keys and values. */
static int valid_opts(const char *s)
{
	size_t n = strlen(s);
	if (n >= OPTS_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || strchr("._-/:=,", c)))
			return 0;
	}
	return 1;
}

static int opt_cb(int val, const char *optarg, int remote)
{
	(void) val;
	(void) remote;
	/* A bare `#SBATCH --resilio` reaches the script's srun through
	 * SLURM_SPANK__SLURM_SPANK_OPTION_resilio_resilio, whose value Slurm
	 * writes as the literal "(null)": the bare option, not a value. */
	if (optarg == NULL || optarg[0] == '\0' || strcmp(optarg, "(null)") == 0) {
		wanted = 1;
		opts[0] = '\0';
		return ESPANK_SUCCESS;
	}
	if (strcmp(optarg, "off") == 0) {
		wanted = 0;
		return ESPANK_SUCCESS;
	}
	if (!valid_opts(optarg)) {
		slurm_error("resilio: --resilio=%s: expected key=value,... of letters, digits and ._-/: (e.g. --resilio=max-restarts=3,stall-timeout=5m)",
			    optarg);
		return ESPANK_BAD_ARG;
	}
	wanted = 1;
	snprintf(opts, sizeof(opts), "%s", optarg);
	return ESPANK_SUCCESS;
}

static struct spank_option resilio_option = {
	"resilio", "[key=value,...]",
	"run every task under resilio (a rank agent; in sbatch, the batch script under the job level): "
	"keys max-restarts, stall-timeout, startup-timeout, stall-floor, eval-timeout, checkpoint-timeout, kill-grace, config, and observe (journal what would be done, do nothing); --resilio=off turns a site default off",
	2, 0, opt_cb
};

static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "resilio=", 8) == 0) {
			const char *p = av[i] + 8;
			if (p[0] != '/' || strlen(p) >= sizeof(resilio_bin)) {
				slurm_error("resilio: plugstack.conf: resilio=%s must be an absolute path", p);
				return -1;
			}
			snprintf(resilio_bin, sizeof(resilio_bin), "%s", p);
		} else if (strncmp(av[i], "state_dir=", 10) == 0) {
			const char *p = av[i] + 10;
			if (p[0] != '/' || strlen(p) >= sizeof(state_dir)) {
				slurm_error("resilio: plugstack.conf: state_dir=%s must be an absolute path", p);
				return -1;
			}
			snprintf(state_dir, sizeof(state_dir), "%s", p);
		} else if (strcmp(av[i], "default=on") == 0) {
			default_on = 1;
		} else if (strcmp(av[i], "default=off") == 0) {
			default_on = 0;
		} else {
			slurm_error("resilio: plugstack.conf: unknown argument '%s' (known: resilio=PATH state_dir=DIR default=on|off)",
				    av[i]);
			return -1;
		}
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (parse_args(ac, av) < 0)
		return -1;
	if (spank_option_register(sp, &resilio_option) != ESPANK_SUCCESS) {
		slurm_error("resilio: cannot register --resilio");
		return -1;
	}
	return 0;
}

static int enabled(void)
{
	return wanted == 1 || (wanted == -1 && default_on);
}

/* The basename of a path. */
static const char *base(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	int argc = 0;
	char **argv = NULL;

	if (!spank_remote(sp) || !enabled())
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS ||
	    argc < 1 || argv == NULL || argv[0] == NULL)
		return 0;
	/* Already under resilio (`srun --resilio resilio run ...`): as is. */
	if (strcmp(base(argv[0]), "resilio") == 0)
		return 0;
	if (access(resilio_bin, X_OK) != 0) {
		/* Fail open: the task runs unwrapped, and says why. */
		slurm_error("resilio: %s: %s; the task runs without resilio",
			    resilio_bin, strerror(errno));
		return 0;
	}
	if (spank_setenv(sp, "RESILIO_SPANK_EXEC", argv[0], 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "RESILIO_SPANK_OPTS", opts, 1) != ESPANK_SUCCESS) {
		slurm_error("resilio: cannot set the task's environment; the task runs without resilio");
		return 0;
	}
	if (state_dir[0] != '\0')
		spank_setenv(sp, "RESILIO_STATE_DIR", state_dir, 0);
	char *bin = strdup(resilio_bin);
	if (bin == NULL)
		return 0;
	argv[0] = bin;
	return 0;
}

/* Write STATE/jobs/JOB/task-exit/NAME (under a site-wide state dir
 * STATE/users/USER/jobs/...) as the job's user: called in a child
 * that dropped root for the job's uid, gid and groups, so that whatever the
 * user's path holds (symlinks to /etc, a FIFO, someone else's directory),
 * nothing happens that the user could not have done. Returns the exit code
 * of the child. */
static int write_as_user(const char *sd, uint32_t job, const char *name, int status)
{
	char dir[PATH_MAX], path[PATH_MAX + 64];
	struct stat sst;
	/* A site-wide state dir (a sticky, world-writable directory): the
	 * user's own part of it, STATE/users/NAME, as resilio writes it. */
	if (stat(sd, &sst) == 0 && S_ISDIR(sst.st_mode) &&
	    (sst.st_mode & (S_ISVTX | S_IWOTH)) == (S_ISVTX | S_IWOTH)) {
		struct passwd *pw = getpwuid(getuid());
		if (pw == NULL || pw->pw_name == NULL)
			return 6;
		if (snprintf(dir, sizeof(dir), "%s/users/%s/jobs/%u/task-exit", sd, pw->pw_name,
			     job) >= (int) sizeof(dir))
			return 7;
	} else if (snprintf(dir, sizeof(dir), "%s/jobs/%u/task-exit", sd, job) >=
		   (int) sizeof(dir)) {
		return 7;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		return 2;
	/* O_NONBLOCK: a FIFO planted there must not hold the step. */
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
		      0644);
	if (fd < 0)
		return 3;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return 4;
	}
	char line[64];
	int n = snprintf(line, sizeof(line), "raw_status=%d\n", status);
	int ok = write(fd, line, (size_t) n) == n;
	close(fd);
	return ok ? 0 : 5;
}

/* Each task's raw wait status, for when its agent died with it (or with
 * its node): STATE_DIR/jobs/JOB/task-exit/STEP.TASK (`.rN` after N requeues), one line
 * `raw_status=N`. The state dir is the task's RESILIO_STATE_DIR, else the
 * plugstack's.
 *
 * slurmstepd runs this as root, and the path is the user's to choose: the
 * file work runs in a child that first becomes the job's user (its groups,
 * gid, then uid, all of them real, effective and saved), never as root. The
 * step waits for it at most TASK_EXIT_WAIT_MS (a hung file system). */
#define TASK_EXIT_WAIT_MS 5000
int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	uint32_t job = 0, step = 0, task = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	gid_t *gids = NULL;
	int ngids = 0;
	int status = 0;
	char name[64], sd[PATH_MAX];

	if (!spank_remote(sp) || !enabled())
		return 0;
	if (spank_get_item(sp, S_TASK_EXIT_STATUS, &status) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
		return 0;
	if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) != ESPANK_SUCCESS)
		ngids = 0;
	if (spank_getenv(sp, "RESILIO_STATE_DIR", sd, sizeof(sd)) != ESPANK_SUCCESS)
		snprintf(sd, sizeof(sd), "%s", state_dir);
	if (sd[0] != '/')
		return 0;
	if (step == SLURM_BATCH_SCRIPT)
		snprintf(name, sizeof(name), "batch.%u", task);
	else
		snprintf(name, sizeof(name), "%u.%u", step, task);
	/* Step ids start again at 0 in a requeued allocation: its files get
	 * the requeue count (`0.1.r1`) instead of replacing the first's. */
	char restarts[16];
	if (spank_getenv(sp, "SLURM_RESTART_COUNT", restarts, sizeof(restarts)) == ESPANK_SUCCESS) {
		char *end = NULL;
		unsigned long n = strtoul(restarts, &end, 10);
		if (end != restarts && *end == '\0' && n > 0 && n < 100000) {
			size_t len = strlen(name);
			snprintf(name + len, sizeof(name) - len, ".r%lu", n);
		}
	}

	pid_t pid = fork();
	if (pid < 0) {
		slurm_debug("resilio: fork for task-exit %s: %s", name, strerror(errno));
		return 0;
	}
	if (pid == 0) {
		/* The job's user, for good, before touching the path. */
		if (setgroups(ngids > 0 ? (size_t) ngids : 0, ngids > 0 ? gids : NULL) != 0 ||
		    setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
			_exit(1);
		if (uid != 0 && (geteuid() == 0 || setuid(0) == 0))
			_exit(1);
		umask(022);
		_exit(write_as_user(sd, job, name, status));
	}
	int st = 0;
	for (int waited = 0;; waited += 10) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return 0;
		if (waited >= TASK_EXIT_WAIT_MS) {
			kill(pid, SIGKILL);
			slurm_debug("resilio: task-exit %s: not written within %d ms", name,
				    TASK_EXIT_WAIT_MS);
			/* Reaped if it ever returns; the step goes on. */
			waitpid(pid, &st, WNOHANG);
			return 0;
		}
		usleep(10000);
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		slurm_debug("resilio: task-exit %s: not written as uid %u (step %d)", name, (unsigned) uid,
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	return 0;
}
