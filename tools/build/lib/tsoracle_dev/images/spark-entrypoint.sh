#!/bin/bash
# The entrypoint of the tsoracle-spark image (images.toml [spark], beside this file).
#
# Spark's Kubernetes scheduler starts its pods from this image with container args:
#   driver --properties-file FILE --class CLASS RESOURCE [ARGS...]
#       the driver pod (cluster deploy mode): spark-submit again, in client deploy mode inside
#       the pod, bound to the pod's IP ($SPARK_DRIVER_BIND_ADDRESS);
#   executor
#       an executor pod: KubernetesExecutorBackend, configured by the SPARK_* variables the
#       scheduler sets on the pod (see EXECUTOR_ENV below);
# and any other args run as given (`tsoracle --version`, `python -c ...`, `spark-submit ...`).
#
# Spark here is the pyspark wheel in the venv (SPARK_HOME is its package directory, with the
# jars and bin/spark-submit) and Java is Debian's JRE. The image runs as uid 65532 with no
# home directory and possibly a read-only root filesystem: HOME (and the JVMs' user.home, where
# Ivy puts --packages downloads) is moved to a writable directory, /tmp unless set.

set -euo pipefail

prog=spark-entrypoint

fail() {
    echo "$prog: $*" >&2
    exit 64
}

# --- the environment --------------------------------------------------------------------------

if [ -z "${JAVA_HOME:-}" ]; then
    java=$(command -v java) || fail "no java on PATH and JAVA_HOME is not set"
    java=$(readlink -f "$java")
    JAVA_HOME=${java%/bin/java}
fi
if [ -z "${SPARK_HOME:-}" ]; then
    for dir in /opt/tsoracle/lib/python3*/site-packages/pyspark; do
        SPARK_HOME=$dir
    done
fi
[ -x "${SPARK_HOME:-}/bin/spark-submit" ] \
    || fail "SPARK_HOME=${SPARK_HOME:-} has no bin/spark-submit (is pyspark installed?)"
: "${PYSPARK_PYTHON:=/opt/tsoracle/bin/python}"
if [ -z "${HOME:-}" ] || [ ! -d "$HOME" ] || [ ! -w "$HOME" ]; then
    HOME=${TMPDIR:-/tmp}
fi
export JAVA_HOME SPARK_HOME PYSPARK_PYTHON HOME

# Run the command under tini (signals forwarded, the zombies Python workers leave reaped) when
# the image has it.
run() {
    if command -v tini >/dev/null; then
        exec tini -s -- "$@"
    fi
    exec "$@"
}

# The variables a command needs, or a message naming the missing ones.
require() {
    local role=$1 missing=() name
    shift
    for name in "$@"; do
        [ -n "${!name:-}" ] || missing+=("$name")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        fail "$role: missing environment variable(s) ${missing[*]}. Spark's Kubernetes" \
            "scheduler sets these on the pods it creates; '$role' is not meant to be run by hand."
    fi
}

# The JVM options the scheduler passes as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... (one option
# per variable, in the order of the number).
java_opts=()
while read -r name; do
    java_opts+=("${!name}")
done < <(compgen -e | grep -E '^SPARK_JAVA_OPT_[0-9]+$' | sort -t_ -k4 -n || true)

# --- the roles --------------------------------------------------------------------------------

EXECUTOR_ENV=(SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_APPLICATION_ID
              SPARK_EXECUTOR_POD_IP SPARK_RESOURCE_PROFILE_ID SPARK_EXECUTOR_POD_NAME
              SPARK_EXECUTOR_MEMORY)

case "${1:-}" in
driver)
    shift
    require driver SPARK_DRIVER_BIND_ADDRESS
    # Spark fetches the application's jars and files into the working directory (an
    # executor's ./<jar>): the image's / is not writable by its user.
    cd "$HOME"
    # spark-submit's own JVM is the driver (client deploy mode), so its options go there.
    export SPARK_SUBMIT_OPTS="-Duser.home=$HOME${SPARK_SUBMIT_OPTS:+ $SPARK_SUBMIT_OPTS}"
    run "$SPARK_HOME/bin/spark-submit" \
        --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
        --deploy-mode client \
        "$@"
    ;;
executor)
    shift
    require executor "${EXECUTOR_ENV[@]}"
    cd "$HOME"
    # The mounted configuration (log4j2 properties and the like) ahead of the jars.
    classpath=
    for dir in "${SPARK_CONF_DIR:-}" "${HADOOP_CONF_DIR:-}" "${SPARK_CLASSPATH:-}"; do
        [ -n "$dir" ] && classpath+="$dir:"
    done
    classpath+="$SPARK_HOME/jars/*"
    for extra in "${SPARK_EXTRA_CLASSPATH:-}" "${SPARK_DIST_CLASSPATH:-}"; do
        [ -n "$extra" ] && classpath+=":$extra"
    done
    if [ -n "${SPARK_EXECUTOR_LIBRARY_PATH:-}" ]; then
        export LD_LIBRARY_PATH="$SPARK_EXECUTOR_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    run "$JAVA_HOME/bin/java" \
        "-Duser.home=$HOME" \
        "${java_opts[@]}" \
        "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
        -cp "$classpath" \
        org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
        --driver-url "$SPARK_DRIVER_URL" \
        --executor-id "$SPARK_EXECUTOR_ID" \
        --cores "$SPARK_EXECUTOR_CORES" \
        --app-id "$SPARK_APPLICATION_ID" \
        --hostname "$SPARK_EXECUTOR_POD_IP" \
        --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
        --podName "$SPARK_EXECUTOR_POD_NAME" \
        "$@"
    ;;
"")
    fail "no command. Args 'driver ...' and 'executor' are Spark on Kubernetes' pods;" \
        "anything else runs as given (e.g. tsoracle --version)."
    ;;
*)
    run "$@"
    ;;
esac
