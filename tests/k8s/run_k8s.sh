#!/bin/sh
# run_k8s.sh SRC PDCTL ROUTER PREFILL DECODE: deploy/k8s checked as far as
# this machine allows (no cluster): validate.mjs (Kubernetes API schemas
# from the kubernetes-models npm package, unknown fields, cross-references);
# a broken copy must fail it (the check can fail); configmap.yaml is what
# render.sh makes of pdserve.ini (no drift); each role's config in it passes
# that daemon's own --check-config. Installs the npm packages into
# tests/k8s/node_modules on first use; exit 77 (skip) without node/npm or
# the registry.
set -u
src=$1 pdctl=$2 router=$3 prefill=$4 decode=$5
here=$src/tests/k8s k8s=$src/deploy/k8s
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
sh "$src/tests/npm-install.sh" "$here" || exit $?
fails=0
t=$(mktemp -d /tmp/pd-k8s.XXXXXX)
trap 'rm -rf "$t"' EXIT
# the binaries the image's package installs, for the containers' commands
BINS="$(basename "$router") $(basename "$prefill") $(basename "$decode") $(basename "$pdctl")"
export BINS
node "$here/validate.mjs" "$k8s" || fails=$((fails + 1))
# the validator must catch a typo the schema alone lets through, a wrong
# type, and a probe on a port that does not exist
cp -r "$k8s" "$t/broken"
sed -i 's/readinessProbe:/readinesProbe:/' "$t/broken/decode.yaml"
sed -i 's/containerPort: 8000/containerPort: "8000"/; s/port: http$/port: htp/' "$t/broken/router.yaml"
sed -i 's/command: \["pd-decode"\]/command: ["pd-decoder"]/; s/command: \["sleep", "5"\]/command: ["true"]/' "$t/broken/decode.yaml"
sed -i '/rm -f \/etc\/pdserve\/secret/d; s/^USER .*/USER 0:0/' "$t/broken/Containerfile"
out=$(node "$here/validate.mjs" "$t/broken")
for want in 'unknown field "readinesProbe"' 'containerPort must be integer' 'no port named htp' \
            'command pd-decoder is not a binary' 'decode: no preStop sleep' "keeps the postinst's secret" \
            "the image's USER is 0:0"; do
    echo "$out" | grep -q "$want" || { echo "FAIL validator missed: $want"; fails=$((fails + 1)); }
done
# the ConfigMap is the deployment file's rendering
"$k8s/render.sh" "$pdctl" "$k8s/pdserve.ini" >"$t/cm.yaml" || fails=$((fails + 1))
if ! diff -u "$k8s/configmap.yaml" "$t/cm.yaml"; then
    echo "FAIL deploy/k8s/configmap.yaml differs from render.sh pdserve.ini (run it again)"
    fails=$((fails + 1))
fi
# each role's config passes its daemon's own parser
NODE_PATH=$here/node_modules node -e '
const YAML = require("yaml"), fs = require("fs");
const cm = YAML.parse(fs.readFileSync(process.argv[1], "utf8"));
for (const [k, v] of Object.entries(cm.data)) fs.writeFileSync(process.argv[2] + "/" + k, v);
' "$k8s/configmap.yaml" "$t" || fails=$((fails + 1))
# (the Secret the pods mount at /etc/pdserve/secret: a generated one here,
# since --check-config loads it as the daemon would)
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$t/secret"
for r in router prefill decode; do
    eval bin=\$$r
    if "$bin" --check-config --config="$t/$r.ini" --secret-file="$t/secret" >/dev/null 2>"$t/err"; then
        echo "ok   - $r.ini: $(basename "$bin") --check-config"
    else
        echo "FAIL $r.ini: $(cat "$t/err")"
        fails=$((fails + 1))
    fi
done
echo "k8s: $fails failure(s)"
[ $fails = 0 ]
