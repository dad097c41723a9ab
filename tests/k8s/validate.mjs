// validate.mjs DIR: every manifest of deploy/k8s (kustomization.yaml's
// resources) checked against the Kubernetes API schemas offline:
//   1. schema: kubernetes-models' validators (generated from the Kubernetes
//      OpenAPI spec: types, required fields, enums, formats);
//   2. no unknown field anywhere (a typo such as `readinesProbe` passes the
//      schema, which allows extra properties): each object is walked along
//      the same models' type declarations;
//   3. cross-references: workload selectors match their pod labels, every
//      Service and PodDisruptionBudget selects some workload's pods, a
//      StatefulSet's serviceName is a headless Service, volumes name an
//      existing ConfigMap / Secret key, every container has readiness and
//      liveness probes on /ready and /health at a declared port.
// Prints one line per finding; exit 1 if any.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import YAML from "yaml";

const dir = process.argv[2];
const require = createRequire(import.meta.url);
const modelsRoot = path.dirname(require.resolve("kubernetes-models/package.json"));
const nm = path.dirname(modelsRoot);   // node_modules
const errors = [];
const err = (where, msg) => errors.push(`${where}: ${msg}`);

// ---- load ------------------------------------------------------------------
const kust = YAML.parse(fs.readFileSync(path.join(dir, "kustomization.yaml"), "utf8"));
const docs = [];
for (const f of kust.resources) {
  const text = fs.readFileSync(path.join(dir, f), "utf8");
  for (const d of YAML.parseAllDocuments(text)) {
    if (d.errors.length) err(f, `YAML: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o) docs.push({ file: f, o });
  }
}
const listed = new Set(kust.resources);
for (const f of fs.readdirSync(dir))
  if (f.endsWith(".yaml") && f !== "kustomization.yaml" && !listed.has(f))
    err(f, "not listed in kustomization.yaml");

// ---- 1. schema ---------------------------------------------------------------
function modelPath(apiVersion, kind) {
  const [g, v] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  return g === "" ? `kubernetes-models/${v}/${kind}` : `kubernetes-models/${g}/${v}/${kind}`;
}
for (const { file, o } of docs) {
  const where = `${file} ${o.kind}/${o.metadata?.name}`;
  if (o.apiVersion?.startsWith("kustomize")) continue;
  let mod;
  try {
    mod = await import(modelPath(o.apiVersion, o.kind));
  } catch (e) {
    err(where, `unknown apiVersion/kind ${o.apiVersion} ${o.kind}`);
    continue;
  }
  try {
    new mod[o.kind](o).validate();
  } catch (e) {
    err(where, `schema: ${e.message.split("\n")[0]}`);
  }
}

// ---- 2. unknown fields, along the models' type declarations -----------------
const ifaceCache = new Map();
function dtsOf(spec, fromFile) {
  let p;
  if (spec.startsWith(".")) p = path.resolve(path.dirname(fromFile), spec);
  else p = path.join(nm, spec);
  p = p.replace(/\.js$/, "");
  return p + ".d.ts";
}
function iface(file) {
  if (ifaceCache.has(file)) return ifaceCache.get(file);
  const text = fs.readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([A-Za-z0-9_]+) \} from "([^"]+)";/g))
    imports.set(m[1], dtsOf(m[2], file));
  const m = text.match(/export interface [A-Za-z0-9_]+(?: extends [^{]+)? \{\n([\s\S]*?)\n\}\n/);
  let props = null;
  if (m) {
    props = new Map();
    const body = m[1].replace(/^[ \t]*\/\*\*[\s\S]*?\*\/[ \t]*\n/gm, "");
    const re = /^ {4}"([^"]+)"\??: ([\s\S]*?);\n(?= {4}"|$)/gm;
    for (const p of (body + "\n").matchAll(re)) props.set(p[1], p[2].trim());
  }
  const r = { props, imports };
  ifaceCache.set(file, r);
  return r;
}
function walk(obj, file, where) {
  const t = iface(file);
  if (!t.props || obj === null || typeof obj !== "object" || Array.isArray(obj)) return;
  for (const [k, v] of Object.entries(obj)) {
    if (!t.props.has(k)) {
      err(where, `unknown field "${k}"`);
      continue;
    }
    walkType(v, t.props.get(k), t, file, `${where}.${k}`);
  }
}
function walkType(v, type, t, file, where) {
  const arr = type.match(/^Array<(.+)>$/s);
  if (arr) {
    if (Array.isArray(v)) v.forEach((x, i) => walkType(x, arr[1].trim(), t, file, `${where}[${i}]`));
    return;
  }
  if (/^I[A-Za-z0-9]+$/.test(type) && t.imports.has(type)) walk(v, t.imports.get(type), where);
}
let walked = 0;
for (const { file, o } of docs) {
  if (o.apiVersion?.startsWith("kustomize")) continue;
  const f = dtsOf(modelPath(o.apiVersion, o.kind), path.join(nm, "x"));
  if (!fs.existsSync(f) || !iface(f).props || iface(f).props.size < 3) {
    err(`${file} ${o.kind}`, `cannot read the type declarations (${f})`);
    continue;
  }
  walk(o, f, `${file} ${o.kind}/${o.metadata?.name}`);
  walked++;
}
// the walk must have reached deep types (a container's fields), or it
// checked nothing
if (walked > 0 && ![...ifaceCache.values()].some((t) => t.props?.has("readinessProbe")))
  err(dir, "the field walk never reached a Container: type declarations changed?");

// ---- 3. cross-references --------------------------------------------------------
const byKind = (k) => docs.filter((d) => d.o.kind === k);
const workloads = docs.filter((d) => ["Deployment", "StatefulSet"].includes(d.o.kind));
const matches = (sel, labels) =>
  sel && Object.keys(sel).length > 0 && Object.entries(sel).every(([k, v]) => labels?.[k] === v);
const podLabels = workloads.map((w) => w.o.spec.template.metadata.labels);
for (const { file, o } of workloads) {
  const where = `${file} ${o.kind}/${o.metadata.name}`;
  if (!matches(o.spec.selector.matchLabels, o.spec.template.metadata.labels))
    err(where, "selector does not match the pod template's labels");
  if (o.kind === "StatefulSet") {
    const svc = byKind("Service").find((s) => s.o.metadata.name === o.spec.serviceName);
    if (!svc) err(where, `serviceName ${o.spec.serviceName}: no such Service`);
    else if (svc.o.spec.clusterIP !== "None") err(where, `serviceName ${o.spec.serviceName} is not headless`);
  }
  const spec = o.spec.template.spec;
  for (const v of spec.volumes ?? []) {
    const ref = v.configMap ? ["ConfigMap", v.configMap.name, v.configMap.items, "data"]
              : v.secret ? ["Secret", v.secret.secretName, v.secret.items, "stringData"] : null;
    if (!ref) continue;
    const target = byKind(ref[0]).find((d) => d.o.metadata.name === ref[1]);
    if (!target) { err(where, `volume ${v.name}: no ${ref[0]} ${ref[1]}`); continue; }
    const keys = { ...(target.o.data ?? {}), ...(target.o[ref[3]] ?? {}) };
    for (const it of ref[2] ?? [])
      if (!(it.key in keys)) err(where, `volume ${v.name}: ${ref[0]} ${ref[1]} has no key ${it.key}`);
  }
  const names = new Set([...(spec.volumes ?? []), ...(o.spec.volumeClaimTemplates ?? []).map((t) => t.metadata)]
                          .map((v) => v.name));
  for (const c of spec.containers) {
    const cw = `${where} container ${c.name}`;
    for (const m of c.volumeMounts ?? []) if (!names.has(m.name)) err(cw, `mount ${m.name}: no such volume`);
    const ports = new Map((c.ports ?? []).map((p) => [p.name, p.containerPort]));
    // a pdserve daemon: a preStop delay (endpoint removal is asynchronous)
    // inside the grace period, and its role spread over nodes
    if (c.image?.startsWith("pdserve")) {
      const ps = c.lifecycle?.preStop?.exec?.command;
      if (!ps || ps[0] !== "sleep" || !(Number(ps[1]) > 0)) err(cw, "no preStop sleep");
      else if (!(spec.terminationGracePeriodSeconds > Number(ps[1]) + 30))
        err(cw, `terminationGracePeriodSeconds ${spec.terminationGracePeriodSeconds} leaves no 30 s drain after the preStop sleep`);
      const terms = spec.affinity?.podAntiAffinity?.preferredDuringSchedulingIgnoredDuringExecution ?? [];
      if (!terms.some(t => t.podAffinityTerm?.topologyKey === "kubernetes.io/hostname" &&
                           t.podAffinityTerm?.labelSelector?.matchLabels?.["app.kubernetes.io/component"] ===
                             o.spec.template.metadata?.labels?.["app.kubernetes.io/component"]))
        err(cw, "no podAntiAffinity spreading its role over nodes");
    }
    for (const [probe, want] of [["readinessProbe", new Set(["/ready", "/health"])], ["livenessProbe", new Set(["/health"])]]) {
      const p = c[probe];
      if (!p?.httpGet) { err(cw, `no ${probe} (httpGet)`); continue; }
      if (!want.has(p.httpGet.path)) err(cw, `${probe} on ${p.httpGet.path}, want ${[...want].join(" or ")}`);
      if (typeof p.httpGet.port === "string" && !ports.has(p.httpGet.port))
        err(cw, `${probe}: no port named ${p.httpGet.port}`);
    }
  }
}
for (const { file, o } of [...byKind("Service"), ...byKind("PodDisruptionBudget")]) {
  const sel = o.kind === "Service" ? o.spec.selector : o.spec.selector?.matchLabels;
  if (!podLabels.some((l) => matches(sel, l)))
    err(`${file} ${o.kind}/${o.metadata.name}`, "selects no workload's pods");
}
// a NetworkPolicy guards some workload's pods, and lets in only pods that exist
function matchesExpr(sel, labels) {
  return Object.entries(sel?.matchLabels ?? {}).every(([k, v]) => labels?.[k] === v) &&
    (sel?.matchExpressions ?? []).every((e) => e.operator === "In" && e.values.includes(labels?.[e.key]));
}
for (const { file, o } of byKind("NetworkPolicy")) {
  const where = `${file} NetworkPolicy/${o.metadata.name}`;
  if (!podLabels.some((l) => matchesExpr(o.spec.podSelector, l))) err(where, "guards no workload's pods");
  for (const r of o.spec.ingress ?? [])
    for (const f of r.from ?? [])
      if (f.podSelector && !podLabels.some((l) => matchesExpr(f.podSelector, l)))
        err(where, "an ingress rule lets in no workload's pods");
}
for (const { file, o } of byKind("Service")) {
  const w = workloads.find((x) => matches(o.spec.selector, x.o.spec.template.metadata.labels));
  const names = new Set(w ? w.o.spec.template.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => p.name)) : []);
  for (const p of o.spec.ports ?? [])
    if (typeof p.targetPort === "string" && !names.has(p.targetPort))
      err(`${file} Service/${o.metadata.name}`, `targetPort ${p.targetPort}: no such container port`);
}
// ---- 4. the image and the optional ServiceMonitor -------------------------------
// Containerfile: from the Debian package, the pods' uid, no baked-in secret,
// and every container's command is a binary the package installs (the
// daemons' names, checked against BINS from run_k8s.sh: meson's bindir set)
const cf = fs.readFileSync(path.join(dir, "Containerfile"), "utf8");
const bins = new Set((process.env.BINS ?? "").split(" ").filter(Boolean));
if (!/^FROM debian:12/m.test(cf)) err("Containerfile", "not FROM debian:12");
if (!/apt-get install[^\n]*pdserve_\*_amd64\.deb/.test(cf)) err("Containerfile", "does not install the .deb");
if (!/rm -f \/etc\/pdserve\/secret/.test(cf)) err("Containerfile", "keeps the postinst's secret in the image");
const user = cf.match(/^USER (\d+):(\d+)$/m);
for (const { file, o } of workloads) {
  const sc = o.spec.template.spec.securityContext ?? {};
  if (!o.spec.template.spec.containers.some((c) => c.image?.startsWith("pdserve"))) continue; // etcd's own image
  if (!user || sc.runAsUser !== Number(user[1]) || sc.runAsGroup !== Number(user[2]))
    err(`${file} ${o.metadata.name}`, `runs as ${sc.runAsUser}:${sc.runAsGroup}, the image's USER is ${user ? user[1] + ":" + user[2] : "unset"}`);
  for (const c of o.spec.template.spec.containers)
    if (c.image?.startsWith("pdserve") && bins.size && !bins.has(c.command?.[0]))
      err(`${file} ${o.metadata.name}`, `command ${c.command?.[0]} is not a binary the package installs`);
}
// ServiceMonitor: selects the pdserve Services, scrapes /metrics on a port
// each of them names (the router: http; the daemons: metrics)
const sm = YAML.parse(fs.readFileSync(path.join(dir, "monitoring", "servicemonitor.yaml"), "utf8"));
if (sm.apiVersion !== "monitoring.coreos.com/v1" || sm.kind !== "ServiceMonitor") err("servicemonitor.yaml", "not a ServiceMonitor");
for (const { file, o } of byKind("Service")) {
  if (!matches(sm.spec.selector.matchLabels, o.metadata.labels)) {
    if (o.metadata.labels?.["app.kubernetes.io/name"] === "pdserve" && o.metadata.name !== "pdserve-etcd")
      err(`${file} Service/${o.metadata.name}`, "not selected by the ServiceMonitor");
    continue;
  }
  const ports = new Set((o.spec.ports ?? []).map((p) => p.name));
  if (!sm.spec.endpoints.some((e) => ports.has(e.port) && e.path === "/metrics") && !o.metadata.name.includes("etcd"))
    err(`${file} Service/${o.metadata.name}`, "ServiceMonitor scrapes none of its ports");
}
for (const k of ["Deployment", "StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"])
  if (byKind(k).length === 0) err(dir, `no ${k}`);

for (const e of errors) console.log(`FAIL ${e}`);
console.log(`${docs.length} objects, ${errors.length} finding(s)`);
process.exit(errors.length ? 1 : 0);
