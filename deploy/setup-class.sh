#!/usr/bin/env bash
# A one-machine class, set up as root on Debian 12 or 13 (deploy/README.md, "setup-class.sh"):
# the course's environment where learners' accounts can run it, Unix groups and a grading
# account, the course folder and nbgrader's exchange with their owners and modes, a PostgreSQL
# gradebook with password authentication, a Dask scheduler and workers on 127.0.0.1 speaking
# TLS only, the grading-on-submit watcher (idle until an instructor turns it on), and
# JupyterHub with PAM logins, each user's server running as that user's account.
# Idempotent: run it again after a change and it repairs what differs. Every service binds
# 127.0.0.1 (put a TLS-terminating reverse proxy in front of the hub for a real class).
#
#   deploy/setup-class.sh [--demo N] [--course DIR] [--exchange DIR] [--hub-port P]
#                         [--dask-port P] [--dask-workers N]
#   deploy/setup-class.sh --remove        # undo a --demo set-up entirely
#
# The hub takes three ports: --hub-port P for the browser, P+1 for the hub's own server and
# P+2 for its proxy's API; Dask's scheduler takes --dask-port.
#
# What it made is written to /etc/pallas-course/class.env (KEY=value, no secrets); source it
# before running `pallas-course` as an instructor.
set -euo pipefail
umask 022

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=/opt/pallas-course            # python/ (when copied), venv/, grading/, learner/, jupyterhub/
STATE=/var/lib/pallas-course         # hub state, TLS keys, the gradebook password, logs, pids
ETC=/etc/pallas-course               # class.env, jupyterhub_config.py, dask/ (no secrets)
COURSE=/srv/pallas-course
EXCHANGE=/srv/pallas-exchange
HUB_PORT=8100  # make start serves the site on 8000 and JupyterLab on 8888
DASK_PORT=8786
DASK_WORKERS=2
DEMO=0
REMOVE=0
INSTRUCTORS=pallas-instructors       # instructors and the grading account: the course folder
LEARNERS=pallas-learners             # who may log in to the hub as a learner
GRADER=pallas-grader                 # runs the Dask scheduler and workers (never root)
DB=pallas_course                     # PostgreSQL role and database

die() { echo "setup-class.sh: $*" >&2; exit 1; }
say() { echo "setup-class.sh: $*"; }

while [ $# -gt 0 ]; do
  case $1 in
    --demo) DEMO=${2:?--demo needs a number of learners}; shift 2 ;;
    --remove) REMOVE=1; shift ;;
    --course) COURSE=${2:?}; shift 2 ;;
    --exchange) EXCHANGE=${2:?}; shift 2 ;;
    --hub-port) HUB_PORT=${2:?}; shift 2 ;;
    --dask-port) DASK_PORT=${2:?}; shift 2 ;;
    --dask-workers) DASK_WORKERS=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root (sudo $0 $*): it creates accounts and services"
[[ $DEMO =~ ^[0-9]+$ ]] || die "--demo takes a number of learner accounts, e.g. --demo 3"

VENV=$PREFIX/venv
GRADING=$PREFIX/grading     # grader/ with the hidden cases, kernelsim/: root and the instructors
LEARNING=$PREFIX/learner    # grader/ without them, kernelsim/: every other account
TLS=$STATE/tls
PIDS=$STATE/run
LOGS=$STATE/log

# ----------------------------------------------------------------------------- services
stop_services() {  # stop_services NAME...: SIGTERM their sessions, SIGKILL what is left after
  local name pid pids=()  # 20 s; all at once, each shuts down in about 2 s (hub, Dask)
  for name in "$@"; do
    [ -f "$PIDS/$name.pid" ] || continue
    pid=$(cat "$PIDS/$name.pid")
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  for name in "$@"; do rm -f "$PIDS/$name.pid"; done
}

running() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

start_daemon() {  # start_daemon NAME CMD...: in a session of its own, its pid in run/NAME.pid
  local name=$1; shift
  running "$name" && return 0
  # shellcheck disable=SC2094
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
}

wait_port() {  # wait_port PORT NAME
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    running "$2" || die "$2 exited at start; see $LOGS/$2.log"
    sleep 0.2
  done
  die "$2 does not answer on 127.0.0.1:$1 after 60 s; see $LOGS/$2.log"
}

pg_cluster() {  # "VERSION NAME PORT STATUS" of the first Debian cluster
  pg_lsclusters -h 2>/dev/null | awk 'NR==1 {print $1, $2, $3, $4}'
}

# from /: postgres may not enter the folder this script was started in, and psql said "could
# not change directory" on every run
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

# ----------------------------------------------------------------------------- --remove
if [ "$REMOVE" = 1 ]; then
  [ -f "$STATE/demo" ] || [ ! -d "$STATE" ] || die "$STATE holds a class that was not set up \
with --demo: --remove deletes its course folder and gradebook; back them up and delete \
$STATE/.. by hand, or touch $STATE/demo to confirm"
  stop_services hub grade-on-submit dask-workers dask-scheduler
  if [ -x "$PREFIX/venv/bin/python" ]; then  # the grading account's cgroup folder
    "$PREFIX/venv/bin/python" -I -m grader.jail.pids_cgroup undelegate "$GRADER" || true
  fi
  if command -v pg_lsclusters >/dev/null && read -r v n port st < <(pg_cluster) && [ -n "${v:-}" ]; then
    if [ "$st" = online ]; then
      as_postgres psql -p "$port" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
      as_postgres psql -p "$port" -qc "DROP ROLE IF EXISTS $DB" || true
      if [ -f "$STATE/pg-started" ]; then pg_ctlcluster "$v" "$n" stop || true; fi
    fi
  fi
  remove_account() {  # remove_account USER: its processes, home, and what it left in the
    # shared temp folders (a slot or jail folder named by its uid, a learner's files), which
    # the next account given that uid would own
    local uid
    uid=$(id -u "$1" 2>/dev/null) || return 0
    pkill -KILL -u "$1" 2>/dev/null || true
    userdel -r "$1" 2>/dev/null || userdel "$1" || true
    find /tmp /var/tmp /dev/shm -xdev -mindepth 1 -maxdepth 1 -uid "$uid" \
      -exec rm -rf {} + 2>/dev/null || true
  }
  for u in $(getent group "$LEARNERS" "$INSTRUCTORS" | cut -d: -f4 | tr ',' '\n' | grep '^demo-' | sort -u) \
           demo-instructor $(getent passwd | cut -d: -f1 | grep '^demo-learner[0-9]*$' || true) \
           "$GRADER"; do
    remove_account "$u"
  done
  for g in "$LEARNERS" "$INSTRUCTORS" "$GRADER"; do getent group "$g" >/dev/null && groupdel "$g"; done
  if [ -f "$ETC/class.env" ]; then
    # the paths this set-up used, whatever the options of this run
    COURSE=$(sed -n 's/^PALLAS_COURSE_ROOT=//p' "$ETC/class.env")
    EXCHANGE=$(sed -n 's/^PALLAS_COURSE_EXCHANGE=//p' "$ETC/class.env")
  fi
  rm -rf "$PREFIX" "$STATE" "$ETC" "${COURSE:?}" "${EXCHANGE:?}"
  say "removed the demo class (accounts, services, $COURSE, $EXCHANGE, $PREFIX, $STATE, $ETC)"
  exit 0
fi

# ----------------------------------------------------------------------------- ports
# Before anything is made: a port another program holds would otherwise surface minutes later
# as a hub that answers with someone else's pages.
ports_free() {  # ports_free NAME OPTION PORT...: die if a program other than NAME listens on one
  local name=$1 option=$2 port; shift 2
  running "$name" && return 0
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port (for $name) is taken by another program (\`ss -ltnp sport = :$port\` \
names it): stop it, or choose other ports with $option"
    fi
  done
}
ports_free dask-scheduler --dask-port "$DASK_PORT"
ports_free hub --hub-port "$HUB_PORT" $((HUB_PORT + 1)) $((HUB_PORT + 2))

# ----------------------------------------------------------------------------- packages
missing=""
for cmd in bwrap:bubblewrap patchelf:patchelf openssl:openssl pg_lsclusters:postgresql \
           configurable-http-proxy:"nodejs npm" setpriv:util-linux; do
  command -v "${cmd%%:*}" >/dev/null || missing="$missing ${cmd#*:}"
done
if [ -n "$missing" ]; then
  say "installing:$missing"
  apt-get update -q && apt-get install -y -q $missing || die "apt-get install$missing failed; \
install them by hand, then run this again"
fi
command -v configurable-http-proxy >/dev/null || npm install -g -q --no-fund --no-audit \
  configurable-http-proxy@4.6.3 || die "npm install -g configurable-http-proxy failed"

# ----------------------------------------------------------------------------- accounts
getent group "$INSTRUCTORS" >/dev/null || groupadd "$INSTRUCTORS"
getent group "$LEARNERS" >/dev/null || groupadd "$LEARNERS"
id "$GRADER" >/dev/null 2>&1 || useradd --system --user-group --no-create-home \
  --home-dir "$STATE/grader" --shell /usr/sbin/nologin "$GRADER"
usermod -a -G "$INSTRUCTORS" "$GRADER"
mkdir -p "$STATE" "$TLS" "$PIDS" "$LOGS" "$ETC/dask" "$STATE/hub"
chmod 0755 "$STATE"; chmod 0700 "$STATE/hub" "$PIDS"
install -d -o "$GRADER" -g "$GRADER" -m 0700 "$STATE/grader" "$STATE/grader/dask" "$STATE/grader/tmp"
install -d -o root -g "$GRADER" -m 0770 "$LOGS"

PASSWORDS=$STATE/demo-passwords  # root only: the demo accounts' PAM passwords, "user password"
if [ "$DEMO" -gt 0 ]; then
  touch "$STATE/demo" "$PASSWORDS"; chmod 0600 "$PASSWORDS"
  add_demo() {  # add_demo USER GROUP
    id "$1" >/dev/null 2>&1 || useradd --create-home -K HOME_MODE=0700 --shell /bin/bash \
      -G "$2" "$1"
    usermod -a -G "$2" "$1"
    if ! grep -q "^$1 " "$PASSWORDS"; then
      pw=$(openssl rand -hex 12)
      echo "$1:$pw" | chpasswd
      echo "$1 $pw" >>"$PASSWORDS"
    fi
  }
  add_demo demo-instructor "$INSTRUCTORS"
  for i in $(seq "$DEMO"); do add_demo "demo-learner$i" "$LEARNERS"; done
fi

# A learner's home holds her solved notebooks and her feedback: private to her (0700), whatever
# mode useradd gave it (Debian's default is 0755). Every member of both groups, on every run.
private=""
for u in $(getent group "$LEARNERS" "$INSTRUCTORS" | cut -d: -f4 | tr ',' ' '); do
  home=$(getent passwd "$u" | cut -d: -f6)
  [ "$u" != "$GRADER" ] && [ -d "$home" ] && [ "$(stat -c %a "$home")" != 700 ] || continue
  chmod 0700 "$home"; private="$private $u"
done
[ -z "$private" ] || say "made these homes private (mode 0700, was readable by others):$private"
# The checkout holds the solutions and hidden cases (exercises/source, exercises/refs, .git):
# nobody but root and the instructors may read it (README, "Teaching a class", step 1).
if runuser -u nobody -- test -r "$REPO/exercises/source" 2>/dev/null; then
  say "WARNING: every account can read $REPO, whose exercises/source and .git hold the \
solutions: move it into a folder only root can enter (install -d -m 0700 /opt/src), or \
chmod o-rwx $REPO"
fi

# ----------------------------------------------------------------------------- environment
# The course's .venv (make venv) is copied to $VENV, where every account can run it. Its base
# Python is used where it is: when an unprivileged account can run it (Debian 13's
# /usr/bin/python3.13); else (pyenv's build under /root, mode 0700) it is copied to
# $PREFIX/python and its binary's library path made relative ($ORIGIN/../lib, patchelf).
# grader/ and kernelsim/ are copied beside it (no editable link back into the checkout, whose
# exercises/ holds the solutions).
SRC_VENV=${PALLAS_COURSE_SOURCE_VENV:-$REPO/.venv}
[ -x "$SRC_VENV/bin/python" ] || die "no course environment at $SRC_VENV: run \`make venv\` \
in $REPO first (or name one: PALLAS_COURSE_SOURCE_VENV=/path/to/venv)"
read -r BASE PYVER < <("$SRC_VENV/bin/python" -c \
  'import sys; print(sys.base_prefix, f"{sys.version_info[0]}.{sys.version_info[1]}")')
# copied again when the source venv, pyproject.toml or the course's code changes
stamp="$SRC_VENV $(cd "$REPO" && { stat -c %Y "$SRC_VENV/pyvenv.cfg" pyproject.toml; \
  find grader kernelsim -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 cat; } \
  | md5sum | cut -c1-32)"
if [ ! -f "$VENV/.pallas-stamp" ] || [ "$(cat "$VENV/.pallas-stamp")" != "$stamp" ]; then
  stop_services hub grade-on-submit dask-workers dask-scheduler  # restarted on the new one
  if runuser -u nobody -- "$BASE/bin/python$PYVER" -c '' 2>/dev/null; then
    PYHOME=$BASE
  else
    PYHOME=$PREFIX/python
    say "copying Python $PYVER from $BASE (not executable by other accounts) to $PYHOME"
    rm -rf "$PYHOME.new"; mkdir -p "$PREFIX"
    cp -a "$BASE" "$PYHOME.new"
    patchelf --set-rpath '$ORIGIN/../lib' "$PYHOME.new/bin/python$PYVER"
    chmod -R a+rX "$PYHOME.new"
    rm -rf "$PYHOME"; mv "$PYHOME.new" "$PYHOME"
  fi
  say "copying the course environment $SRC_VENV to $VENV"
  rm -rf "$VENV.new"
  cp -a "$SRC_VENV" "$VENV.new"
  rm -f "$VENV.new"/bin/python*
  for p in python python3 "python$PYVER"; do ln -s "$PYHOME/bin/python$PYVER" "$VENV.new/bin/$p"; done
  sed -i "s|^home = .*|home = $PYHOME/bin|; s|^executable = .*|executable = $PYHOME/bin/python$PYVER|; \
s|^command = .*|command = $PYHOME/bin/python$PYVER -m venv $VENV|" "$VENV.new/pyvenv.cfg"
  grep -rlIs "$SRC_VENV" "$VENV.new/bin" | xargs -r sed -i "s|$SRC_VENV|$VENV|g"
  site=$VENV.new/lib/python$PYVER/site-packages
  rm -rf "$site"/__editable__*pallas_course* "${site:?}/grader" "${site:?}/kernelsim"
  # grader/ and kernelsim/ in two trees, and a .pth file that puts the first one this account
  # may enter on the path: $GRADING (grader/ with its hidden cases) for the instructors' group,
  # the grading account and root; $LEARNING (the same with the hidden cases cut out, as the
  # student copy cuts them: grader/learner/dist.py) for everyone else. Outside the venv: a
  # jailed notebook sees the venv, and must see no grader/ but its own (grader/jail/trusted.py)
  rm -rf "$GRADING.new" "$LEARNING.new"
  mkdir -p "$LEARNING.new"
  install -d -o root -g "$INSTRUCTORS" -m 0750 "$GRADING.new"  # closed before anything is in it
  for pkg in grader kernelsim; do
    cp -r "$REPO/$pkg" "$GRADING.new/$pkg"
    find "$GRADING.new/$pkg" -name __pycache__ -prune -exec rm -rf {} +
  done
  cp -r "$GRADING.new/kernelsim" "$LEARNING.new/kernelsim"
  PYTHONPATH="$GRADING.new" "$VENV.new/bin/python" -m grader.learner.dist \
    "$GRADING.new/grader" "$LEARNING.new/grader" \
    || die "could not write the learners' grader/ without hidden cases; see the error above"
  printf '%s\n' "import os, sys; sys.path[0:0] = [p for p in (\"$GRADING\", \"$LEARNING\") \
if os.access(p, os.X_OK)][:1]" >"$site/pallas_course.pth"
  chmod -R a+rX "$VENV.new" "$LEARNING.new"
  rm -rf "$VENV" "$GRADING" "$LEARNING"
  mv "$VENV.new" "$VENV"; mv "$GRADING.new" "$GRADING"; mv "$LEARNING.new" "$LEARNING"
  # compiled here, under the name they are imported by: the accounts that run the grading and
  # the hub cannot write beside them, and would compile all of grader/ and kernelsim/ from source
  # (0.3 s) in every process they start (a jailed run, a worker, a server)
  "$VENV/bin/python" -m compileall -q -j0 "$GRADING" "$LEARNING"
  # checked before the stamp is written: a rerun skips this (2 s of imports) only for an
  # environment that has run as an unprivileged account
  runuser -u nobody -- "$VENV/bin/python" -c 'import grader.cli, nbgrader, jupyterhub' \
    || die "$VENV/bin/python does not run as an unprivileged account; see the error above"
  echo "$stamp" >"$VENV/.pallas-stamp"
fi
# the hidden cases: root's and the instructors' group's (the grading account is in it) alone,
# on every run
chown -R root:"$INSTRUCTORS" "$GRADING"
chmod -R u=rwX,g=rX,o= "$GRADING"
# the hub's configuration and the per-role Jupyter configurations, readable by every server
rm -rf "$PREFIX/jupyterhub"; cp -r "$REPO/deploy/jupyterhub" "$PREFIX/jupyterhub"
chmod 0755 "$PREFIX"; chmod -R a+rX "$PREFIX/jupyterhub" "$VENV" "$LEARNING"
# (from /, where no grader/ is: Python puts the folder it starts in first on its path)
for who in nobody "$GRADER"; do  # each account gets the grader/ its group allows
  case $who in nobody) want=0 ;; *) want=1 ;; esac
  got=$(cd / && runuser -u "$who" -- "$VENV/bin/python" -c 'from grader import tasks
print(int(any(c.hidden for t in tasks.TASKS for c in t.cases)))') \
    || die "$VENV/bin/python cannot import grader.tasks as $who; see the error above"
  [ "$got" = "$want" ] || die "$who's grader.tasks $([ "$want" = 1 ] && echo lacks || echo \
holds) the hidden cases: check the modes of $GRADING (0750 root:$INSTRUCTORS) and \
$VENV/lib/python$PYVER/site-packages/pallas_course.pth"
done

# ----------------------------------------------------------------------------- course, exchange
# The course folder (sources, solutions, hidden references, submissions, grades) belongs to
# the instructors' group and nobody else: 2770 folders, 0660 files (setgid: new files keep the
# group). The exchange is outside it, as nbgrader's groupshared layout wants it: the course's
# folder 2775 (instructors release into outbound/), inbound/ 3773 (learners create entries but
# cannot list, rename or delete others'), feedback/ 2771 (nobody lists it; files are named by a
# secret of the submission). Entries are made 2770 by the learner's own nbgrader
# (grader.logistics.inbound.PrivateSubmit) and collected only when owned by the student they name.
if [ ! -f "$COURSE/nbgrader_config.py" ]; then
  say "creating the course folder $COURSE from $REPO/exercises"
  mkdir -p "$COURSE"
  (cd "$REPO/exercises" && cp -r source refs nbgrader_config.py "$COURSE/")
  find "$COURSE" -name '*.ipynb' -delete
fi
# a course folder set up before grader/grading/ was split into rooms (issue 49) keeps its
# nbgrader_config.py, which names the old modules: they work, with a warning, until the
# release grader/__init__.py's DEPRECATED_UNTIL names; the instructors take the new names
if grep -q 'grader\.grading\.' "$COURSE/nbgrader_config.py"; then
  say "NOTE: $COURSE/nbgrader_config.py names grader.grading.* modules, which moved into rooms"
  say "  (they keep working until pallas-course $("$VENV/bin/python" -c \
'import grader; print(grader.DEPRECATED_UNTIL)')): name each by its new name, as"
  say "  $REPO/exercises/nbgrader_config.py does (grader/__init__.py's DEPRECATED lists them)"
fi
# the gradebook's lock (grader/logistics/worker.py), shared by instructors and the grading account
touch "$COURSE/gradebook.db.lock"
chown -R root:"$INSTRUCTORS" "$COURSE"
find "$COURSE" -type d -exec chmod 2770 {} +
find "$COURSE" -type f -exec chmod ug+rw,o-rwx {} +
install -d -o root -g root -m 0755 "$EXCHANGE"
install -d -o root -g "$INSTRUCTORS" -m 2775 "$EXCHANGE/pallas-course" \
  "$EXCHANGE/pallas-course/outbound"
install -d -o root -g "$INSTRUCTORS" -m 3773 "$EXCHANGE/pallas-course/inbound"
install -d -o root -g "$INSTRUCTORS" -m 2771 "$EXCHANGE/pallas-course/feedback"
chmod 2775 "$EXCHANGE/pallas-course" "$EXCHANGE/pallas-course/outbound"
chmod 3773 "$EXCHANGE/pallas-course/inbound"; chmod 2771 "$EXCHANGE/pallas-course/feedback"

# ----------------------------------------------------------------------------- PostgreSQL
# Debian's own cluster, started with pg_ctlcluster where no systemd runs. A role with a
# password (scram-sha-256, Debian's default for 127.0.0.1); the password lives in libpq password
# files (~/.pgpass, 0600) of the instructors and the grading account: the database URL carries
# no secret.
read -r PGV PGN PGPORT PGST < <(pg_cluster) || true
if [ -z "${PGV:-}" ]; then
  PGV=$(ls /usr/lib/postgresql | sort -V | tail -1)
  pg_createcluster "$PGV" main >/dev/null || die "pg_createcluster $PGV main failed"
  read -r PGV PGN PGPORT PGST < <(pg_cluster)
fi
if [ "$PGST" != online ]; then
  if [ -d /run/systemd/system ]; then systemctl start "postgresql@$PGV-$PGN"
  else pg_ctlcluster "$PGV" "$PGN" start; fi || die "PostgreSQL $PGV/$PGN did not start; see \
/var/log/postgresql/postgresql-$PGV-$PGN.log"
  touch "$STATE/pg-started"
fi
PGPASS=$STATE/pgpass
if [ ! -s "$PGPASS" ]; then
  echo "127.0.0.1:$PGPORT:$DB:$DB:$(openssl rand -hex 24)" >"$PGPASS"
fi
chmod 0600 "$PGPASS"
secret=$(cut -d: -f5 "$PGPASS")
sed -i "s|^127.0.0.1:[0-9]*:|127.0.0.1:$PGPORT:|" "$PGPASS"
# libpq reads a password file only when nobody but its owner can: one ~/.pgpass per member of
# the instructors' group (the grading account included)
for u in $(getent group "$INSTRUCTORS" | cut -d: -f4 | tr ',' ' '); do
  home=$(getent passwd "$u" | cut -d: -f6)
  [ -d "$home" ] || continue
  install -o "$u" -g "$(id -gn "$u")" -m 0600 "$PGPASS" "$home/.pgpass"
done
if [ "$(as_postgres psql -p "$PGPORT" -tAc "SELECT 1 FROM pg_roles WHERE rolname='$DB'")" != 1 ]; then
  as_postgres psql -p "$PGPORT" -qc "CREATE ROLE $DB LOGIN"
fi
# the password travels on psql's standard input, never on a command line: every account can
# read every process's /proc/PID/cmdline
as_postgres psql -p "$PGPORT" -q -v ON_ERROR_STOP=1 <<EOF
\set pw '$secret'
ALTER ROLE $DB PASSWORD :'pw';
EOF
if [ "$(as_postgres psql -p "$PGPORT" -tAc "SELECT 1 FROM pg_database WHERE datname='$DB'")" != 1 ]; then
  as_postgres createdb -p "$PGPORT" -O "$DB" "$DB"
fi
DB_URL="postgresql://$DB@127.0.0.1:$PGPORT/$DB"

# ----------------------------------------------------------------------------- Dask with TLS
# One certificate authority; one key pair for the scheduler, the workers and the instructors'
# client, readable by the instructors' group (the grading account is in it), never by learners:
# a Dask client without it is refused (require-encryption, certificates required both ways).
if [ ! -s "$TLS/dask.pem" ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=pallas-course Dask CA" \
    -keyout "$TLS/ca.key" -out "$TLS/ca.pem" 2>/dev/null
  openssl req -newkey rsa:3072 -nodes -subj "/CN=pallas-course grading" \
    -keyout "$TLS/dask.key" -out "$TLS/dask.csr" 2>/dev/null
  openssl x509 -req -in "$TLS/dask.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" \
    -CAcreateserial -days 825 -out "$TLS/dask.pem" \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost') 2>/dev/null
  rm -f "$TLS/dask.csr" "$TLS/ca.key" "$TLS/ca.srl"  # no further certificates are signed
fi
chown -R root:"$INSTRUCTORS" "$TLS"; chmod 0750 "$TLS"; chmod 0640 "$TLS"/*
cat >"$ETC/dask/pallas-course.yaml" <<EOF
# written by deploy/setup-class.sh: Dask for grading speaks TLS only
distributed:
  comm:
    require-encryption: true
    tls:
      ca-file: $TLS/ca.pem
      scheduler: {cert: $TLS/dask.pem, key: $TLS/dask.key}
      worker: {cert: $TLS/dask.pem, key: $TLS/dask.key}
      client: {cert: $TLS/dask.pem, key: $TLS/dask.key}
  scheduler:
    no-workers-timeout: 10m
EOF
# Dask's housekeeping tuned for long grading tasks, and the workers' preload (no secret)
install -m 0644 "$REPO/deploy/dask/grading.yaml" "$ETC/dask/grading.yaml"
chmod -R a+rX "$ETC"
SCHEDULER="tls://127.0.0.1:$DASK_PORT"
grader_env=(env -i PATH="$VENV/bin:/usr/bin:/bin" HOME="$STATE/grader" LANG=C.UTF-8
            DASK_CONFIG="$ETC/dask" PALLAS_COURSE_ROOT="$COURSE"
            PALLAS_COURSE_EXCHANGE="$EXCHANGE" TMPDIR="$STATE/grader/tmp")  # its slots, jails
cd "$STATE/grader"
# Each grading run's processes are counted in a pids cgroup of its own (pids.max), made in a
# cgroup folder handed to the grading account (grader/jail/pids_cgroup.py); under cgroup v2 the
# kernel lets it move its runs' processes only if its services live in that folder too, so they
# start in its daemons/ leaf. Without it a run in the account's jail has no process limit, and
# its status file says so (process_limit).
daemons_cgroup=$("$VENV/bin/python" -I -m grader.jail.pids_cgroup delegate "$GRADER") || {
  say "WARNING: no pids cgroup folder for $GRADER: grading runs will have no process limit"
  daemons_cgroup=""; }
in_cgroup=()
[ -z "$daemons_cgroup" ] ||
  in_cgroup=(sh -c 'echo $$ >"$1" && shift && exec "$@"' sh "$daemons_cgroup")
as_grader=("${in_cgroup[@]}" setpriv --reuid="$GRADER" --regid="$GRADER" --init-groups --)
start_daemon dask-scheduler "${as_grader[@]}" "${grader_env[@]}" "$VENV/bin/dask" scheduler \
  --host 127.0.0.1 --port "$DASK_PORT" --protocol tls --no-dashboard \
  --dashboard-address 127.0.0.1:0
wait_port "$DASK_PORT" dask-scheduler
# the workers: the jail runs without root (bubblewrap in a user namespace), one grading
# process per worker; their servers bind 127.0.0.1 too
start_daemon dask-workers "${as_grader[@]}" "${grader_env[@]}" "$VENV/bin/dask" worker \
  "$SCHEDULER" --host 127.0.0.1 --nthreads 1 --nworkers "$DASK_WORKERS" --no-dashboard \
  --dashboard-address 127.0.0.1:0 --local-directory "$STATE/grader/dask"
"${as_grader[@]}" "${grader_env[@]}" "$VENV/bin/python" - "$SCHEDULER" "$DASK_WORKERS" <<'EOF' \
  || die "the Dask workers did not join; see $LOGS/dask-workers.log"
import sys
from distributed import Client
with Client(sys.argv[1], timeout="60s") as c:
    c.wait_for_workers(int(sys.argv[2]), timeout=120)
EOF
# grading on submit (deploy/README.md): the watcher, as the grading account, which may collect
# (a member of the instructors' group: it reads the exchange's inbound entries), grade on the
# cluster (the Dask key, its own ~/.pgpass) and release feedback. It grades only what an
# instructor turned on (pallas-course grade-on-submit); until then it reads one file per poll.
start_daemon grade-on-submit "${as_grader[@]}" "${grader_env[@]}" PALLAS_COURSE_DB="$DB_URL" \
  "$VENV/bin/pallas-course" watch --scheduler "$SCHEDULER"

# ----------------------------------------------------------------------------- JupyterHub
# PAM logins (members of the learners' and instructors' groups), each server started as its
# user's own Unix account (LocalProcessSpawner) from $VENV; the hub group "instructors" is the
# Unix group's members and gets the formgrader on the course folder. The hub reads them when it
# starts: the configuration names them, and a rerun that changes it restarts the hub, or a new
# instructor's formgrader would answer 404 until someone did.
instructors=$(getent group "$INSTRUCTORS" | cut -d: -f4 | tr ',' '\n' | grep -vx "$GRADER" \
  | sort | paste -sd, -) || true
hub_config=$(cat <<EOF
# written by deploy/setup-class.sh
c = get_config()  # noqa: F821
load_subconfig("$PREFIX/jupyterhub/jupyterhub_config.py")  # noqa: F821
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False  # no login session: pam_systemd needs systemd
c.PAMAuthenticator.allowed_groups = {"$LEARNERS", "$INSTRUCTORS"}
c.Authenticator.allowed_users = set()
c.JupyterHub.load_groups = {"instructors": {"users": [u for u in "$instructors".split(",") if u]}}
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.ip = "127.0.0.1"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.JupyterHub.bind_url = "http://127.0.0.1:$HUB_PORT"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:$((HUB_PORT + 1))"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:$((HUB_PORT + 2))"
c.JupyterHub.db_url = "sqlite:///$STATE/hub/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "$STATE/hub/jupyterhub_cookie_secret"
c.ConfigurableHTTPProxy.pid_file = "$STATE/hub/proxy.pid"
EOF
)
if running hub && [ "$(cat "$ETC/jupyterhub_config.py" 2>/dev/null)" != "$hub_config" ]; then
  say "restarting the hub, whose configuration changed (instructors: ${instructors:-none}); \
the servers running now stop: their users start them again"
  stop_services hub
fi
printf '%s\n' "$hub_config" >"$ETC/jupyterhub_config.py"
cd "$STATE/hub"
start_daemon hub env PATH="$VENV/bin:$(dirname "$(command -v configurable-http-proxy)"):/usr/bin:/bin" \
  PALLAS_COURSE_ROOT="$COURSE" PALLAS_COURSE_EXCHANGE="$EXCHANGE" PALLAS_COURSE_DB="$DB_URL" \
  DASK_CONFIG="$ETC/dask" PALLAS_COURSE_SCHEDULER="$SCHEDULER" \
  "$VENV/bin/jupyterhub" -f "$ETC/jupyterhub_config.py"
wait_port "$HUB_PORT" hub

cat >"$ETC/class.env" <<EOF
PALLAS_COURSE_ROOT=$COURSE
PALLAS_COURSE_EXCHANGE=$EXCHANGE
PALLAS_COURSE_SCHEDULER=$SCHEDULER
PALLAS_COURSE_DB=$DB_URL
DASK_CONFIG=$ETC/dask
PALLAS_COURSE_HUB=http://127.0.0.1:$HUB_PORT
PALLAS_COURSE_VENV=$VENV
EOF
chmod 0644 "$ETC/class.env"
say "class ready: hub http://127.0.0.1:$HUB_PORT, Dask $SCHEDULER, gradebook $DB_URL"
say "as an instructor: set -a; . $ETC/class.env; set +a; $VENV/bin/pallas-course autograde --scheduler \$PALLAS_COURSE_SCHEDULER"
[ "$DEMO" -gt 0 ] && say "demo accounts and passwords: $PASSWORDS (root only)"
exit 0
