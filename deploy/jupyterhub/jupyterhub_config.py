"""JupyterHub for a pallas-course class: a server per learner, nbgrader's exchange between them.

Settings come from the environment (README.md, "Teaching a class"):

PALLAS_COURSE_ROOT         the course folder (a copy of exercises/) on storage the hub's
                           machines share; default /srv/pallas-course
PALLAS_COURSE_INSTRUCTORS  comma-separated hub user names of the instructors
PALLAS_COURSE_LEARNERS     comma-separated hub user names allowed in (unset: only whom the
                           authenticator's own allow settings admit, e.g. an OAuth
                           organisation; JupyterHub admits nobody by default)
PALLAS_COURSE_IMAGE        the single-user image (deploy/jupyterhub/Dockerfile): learners run
                           in containers (DockerSpawner); unset: local processes, one Unix
                           account per user (LocalProcessSpawner)
PALLAS_COURSE_EXCHANGE     nbgrader's exchange (default <course>/exchange)
PALLAS_COURSE_DB           the gradebook's URL when not SQLite in the course (postgresql://...),
                           given to the instructors' servers only, as are DASK_CONFIG and
                           PALLAS_COURSE_SCHEDULER (grading on Dask)

Everybody's server gets the exchange, ``<course>/exchange``, at the same path; the instructors'
also get the course folder. Learners get nbgrader's student extensions (assignment list with
fetch and submit, validate) and no formgrader or assignment creation; instructors get the
formgrader, which uses the course's own nbgrader_config.py, and may frame their own pages
(``frame-ancestors 'self'``, instructor/jupyter_server_config.json: JupyterLab's Formgrader tab
is a frame; the hub's default, ``'none'``, left it blank). Which is which: the hub group
``instructors``. The authenticator is left to the site (JupyterHub's default, PAM, for Unix
accounts; an OAuth one from ``oauthenticator`` for a university login).
"""

import os
import sys

c = get_config()  # noqa: F821 - provided by traitlets when this file is loaded

HERE = os.path.dirname(os.path.abspath(__file__))
COURSE = os.environ.get("PALLAS_COURSE_ROOT", "/srv/pallas-course")
# the exchange: outside the course folder where learners cannot enter the course (setup-class.sh)
EXCHANGE = os.environ.get("PALLAS_COURSE_EXCHANGE") or os.path.join(COURSE, "exchange")
IMAGE = os.environ.get("PALLAS_COURSE_IMAGE")
INSTRUCTORS = [u for u in os.environ.get("PALLAS_COURSE_INSTRUCTORS", "").split(",") if u]
LEARNERS = [u for u in os.environ.get("PALLAS_COURSE_LEARNERS", "").split(",") if u]
# the per-role Jupyter configuration (learner/, instructor/ beside this file); the image copies
# them to /etc/pallas-course
ROLES = "/etc/pallas-course" if IMAGE else HERE

# instructors are not hub admins: grading needs no access to learners' servers
c.JupyterHub.load_groups = {"instructors": {"users": INSTRUCTORS}}
if LEARNERS:
    c.Authenticator.allowed_users = set(LEARNERS) | set(INSTRUCTORS)

c.Spawner.default_url = "/lab"
c.Spawner.environment = {"PALLAS_COURSE_EXCHANGE": EXCHANGE}

if IMAGE:
    c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
    c.DockerSpawner.image = IMAGE
    c.DockerSpawner.remove = True
    c.DockerSpawner.volumes = {EXCHANGE: EXCHANGE}
    c.DockerSpawner.notebook_dir = "/home/jovyan"
else:
    # the hub's own environment is the course's (.venv): its jupyterhub-singleuser
    c.Spawner.cmd = [os.path.join(os.path.dirname(sys.executable), "jupyterhub-singleuser")]


INSTRUCTOR_ENV = ("PALLAS_COURSE_DB", "DASK_CONFIG", "PALLAS_COURSE_SCHEDULER")


def role_setup(spawner):
    """Learner or instructor: which Jupyter config folder, and for instructors the course."""
    instructor = any(g.name == "instructors" for g in spawner.user.groups)
    env = {"JUPYTER_CONFIG_PATH": os.path.join(ROLES, "instructor" if instructor else "learner")}
    if instructor:
        # the formgrader wants the course inside the server's root folder
        env["PALLAS_COURSE_ROOT"] = spawner.notebook_dir = COURSE
        for key in INSTRUCTOR_ENV:
            if os.environ.get(key):
                env[key] = os.environ[key]
        if IMAGE:
            spawner.volumes = {**spawner.volumes, COURSE: COURSE}
    spawner.environment = {**spawner.environment, **env}


c.Spawner.pre_spawn_hook = role_setup
