#!/usr/bin/env bash
# ActiveMQ 5.17.2 with its Jolokia agent at /api/jolokia, as ActiveMQ's own distribution serves it, made from
# the anchor kit (../shared/anchors/activemq-web), whose REST webapp leaves the agent out, and Debian's
# libjolokia-core-java (1.7.1, ActiveMQ 5.17.2's). What docs/api.md ("ActiveMQ's Jolokia view") was checked
# against.
#
#   tools/differential/jolokia_anchor.sh KIT BUILT_ANCHOR_DIR OUT_DIR   (then OUT_DIR/start.sh, OUT_DIR/stop.sh)
#
# KIT: the anchor kit's folder; BUILT_ANCHOR_DIR: what its build.sh made; OUT_DIR: a new folder, a copy of both
# with the agent added. Ports as the kit's start.sh takes them (AMQ_STOMP_PORT, AMQ_WS_PORT, AMQ_HTTP_PORT).
# Needs: apt-get install libjolokia-core-java.
set -euo pipefail
KIT=$(realpath "$1"); BUILT=$(realpath "$2"); OUT=$(realpath -m "$3")
[[ -f /usr/share/java/jolokia-core.jar ]] || { echo "needs Debian's libjolokia-core-java" >&2; exit 1; }
[[ ! -e "$OUT" ]] || { echo "$OUT exists; give a new folder" >&2; exit 1; }
cp -r "$BUILT" "$OUT"
rm -rf "$OUT/run"
cp "$KIT"/* "$OUT/"
# the agent's jars on the broker's classpath, after the kit's own
sed -i 's#"\$J"/commons-io.jar)#"$J"/commons-io.jar "$J"/jolokia-core.jar "$J"/json-simple.jar)#' "$OUT/start.sh"
grep -q jolokia-core.jar "$OUT/start.sh" || { echo "the kit's start.sh changed: add the jars by hand" >&2; exit 1; }
# start.sh and stop.sh take their kit files from their own folder: this one
sed -i 's#^KIT=.*#KIT="'"$OUT"'"#' "$OUT/start.sh" "$OUT/stop.sh"
# the servlet and its mapping, as ActiveMQ's own webapps/api/WEB-INF/web.xml has them (no access policy file:
# everything allowed, as ActiveMQ's default policy allows every read)
python3 - "$OUT/conf/webapps/api/WEB-INF/web.xml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
agent = """
    <servlet>
        <servlet-name>jolokia-agent</servlet-name>
        <servlet-class>org.jolokia.http.AgentServlet</servlet-class>
        <init-param><param-name>allowErrorDetails</param-name><param-value>false</param-value></init-param>
        <load-on-startup>1</load-on-startup>
    </servlet>
    <servlet-mapping>
        <servlet-name>jolokia-agent</servlet-name>
        <url-pattern>/jolokia/*</url-pattern>
    </servlet-mapping>
"""
end = text.rindex("</web-app>")
open(path, "w").write(text[:end] + agent + text[end:])
PY
echo "made $OUT: ANCHOR_DIR=$OUT $OUT/start.sh, then http://127.0.0.1:\${AMQ_HTTP_PORT:-8161}/api/jolokia (admin/admin)"
