// A second WGSL compiler over the wgpu backend's kernels: Tint, through
// Dawn's Node bindings (the `webgpu` npm package) on Dawn's null backend,
// which needs no GPU. Reads a directory written by
// `turbospark kernels --emit DIR` and, for every module in its manifest,
// creates the shader module on a device with exactly the features the
// module needs, then a compute pipeline for every entry point with each
// override set the manifest lists. Fails on any error; lists warnings.
//
// Modules the manifest marks wgpu_only (cooperative matrices, coherent
// storage: no WebGPU equivalent yet) are skipped, each by name.
//
// The null device has WebGPU's default limits (16 KiB of workgroup memory,
// 256 invocations, 8 storage buffers a stage). A pipeline the logs recorded
// (the backend made it under those limits) must fit them; an entry point no
// log names is compiled at its declared defaults, where going over a limit
// is listed, not failed (the backend takes it only on larger devices).
//
// usage: node scripts/tint-check.mjs DIR
// The package is found in $WEBGPU_NODE_MODULES, else .tint/node_modules.

import { readFileSync } from 'node:fs';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const dir = process.argv[2];
if (!dir) {
  console.error('usage: node scripts/tint-check.mjs DIR (from turbospark kernels --emit DIR)');
  process.exit(2);
}
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const modulesDir = process.env.WEBGPU_NODE_MODULES || join(root, '.tint', 'node_modules');
const { create, globals } = await import(pathToFileURL(join(modulesDir, 'webgpu', 'index.js')));
Object.assign(globalThis, globals);

const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
const gpu = create(['backend=null']);

// One device per feature set, so a module compiles with what it asks for
// and nothing more (an adapter gives one device: one adapter each).
const devices = new Map();
async function deviceFor(features) {
  const key = [...features].sort().join(',');
  if (!devices.has(key)) {
    const adapter = await gpu.requestAdapter();
    if (!adapter) throw new Error("Dawn gave no null adapter");
    const missing = features.filter((f) => !adapter.features.has(f));
    if (missing.length) throw new Error(`Dawn's null adapter lacks ${missing.join(', ')}`);
    const device = await adapter.requestDevice({ requiredFeatures: features });
    device.addEventListener?.('uncapturederror', (e) => {
      console.error(`uncaptured: ${e.error.message}`);
    });
    devices.set(key, device);
  }
  return devices.get(key);
}

// WebGPU asks a module that uses subgroup operations to say so; naga (and
// so wgpu) does not accept the directive yet, so the backend's text leaves
// it out. It goes at the head of the first line, keeping line numbers.
function forTint(code, features) {
  return features.includes('subgroups') ? `enable subgroups; ${code}` : code;
}

const isLimit = (m) => /limit|exceed|maxCompute|maxStorage|too many|workgroup storage/i.test(m);

let errors = 0;
let pipelines = 0;
let checked = 0;
const warnings = [];
const overLimit = [];
const skipped = [];
for (const m of manifest.modules) {
  if (m.wgpu_only) {
    skipped.push(`${m.file}: ${m.wgpu_only}`);
    continue;
  }
  const device = await deviceFor(m.features);
  const code = forTint(readFileSync(join(dir, m.file), 'utf8'), m.features);
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ label: m.file, code });
  const info = await module.getCompilationInfo();
  const scoped = await device.popErrorScope();
  let moduleErrors = 0;
  for (const msg of info.messages) {
    const where = `${m.file}:${msg.lineNum}:${msg.linePos}`;
    if (msg.type === 'error') {
      console.error(`error: ${where}: ${msg.message}`);
      moduleErrors++;
    } else if (msg.type === 'warning') {
      warnings.push(`warning: ${where}: ${msg.message}`);
    } else if (moduleErrors) {
      // (notes explaining the error above)
      console.error(`  ${msg.type}: ${where}: ${msg.message}`);
    } else {
      warnings.push(`${msg.type}: ${where}: ${msg.message}`);
    }
  }
  if (scoped && moduleErrors === 0) {
    console.error(`error: ${m.file}: ${scoped.message}`);
    moduleErrors++;
  }
  errors += moduleErrors;
  checked++;
  if (moduleErrors) continue;
  for (const e of m.entry_points) {
    for (const constants of e.overrides) {
      device.pushErrorScope('validation');
      device.createComputePipeline({
        label: `${m.file}::${e.name}`,
        layout: 'auto',
        compute: { module, entryPoint: e.name, constants },
      });
      const err = await device.popErrorScope();
      pipelines++;
      if (!err) continue;
      const what = `${m.file}::${e.name} ${JSON.stringify(constants)}`;
      const first = err.message.split('\n')[0];
      if (!e.recorded && isLimit(err.message)) {
        overLimit.push(`${what}: ${first}`);
      } else {
        console.error(`error: ${what}: ${err.message}`);
        errors++;
      }
    }
  }
}

for (const w of warnings) console.log(w);
for (const s of skipped) console.log(`skipped (no WebGPU equivalent): ${s}`);
for (const o of overLimit) console.log(`over WebGPU's default limits at declared defaults (not recorded under them): ${o}`);
console.log(
  `tint-check: ${checked} modules, ${pipelines} pipelines, ${errors} errors, ` +
    `${warnings.length} warnings and notes, ${skipped.length} skipped, ${overLimit.length} over default limits`,
);
for (const d of devices.values()) d.destroy();
process.exit(errors ? 1 : 0);
