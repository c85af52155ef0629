import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { spawnChild } from './children.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/**
 * A child script and the library sources it imports, transpiled once into dist/test-acquire/<random>/
 * (inside the repository, so that bare imports resolve from its node_modules): four processes that each
 * load TypeScript to transpile them took 10 s on two cores; this takes about one. The child builds what it
 * needs by hand, so no decorator metadata is needed.
 */
export async function buildChild(child: string): Promise<{ entry: string; remove: () => Promise<void> }> {
  const ts = (await import('typescript')).default;
  const out = join(ROOT, 'dist', 'test-acquire', randomUUID().slice(0, 8));
  const pending = [child];
  const seen = new Set<string>();
  while (pending.length > 0) {
    const file = pending.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const source = readFileSync(file, 'utf8');
    for (const [, spec] of source.matchAll(/(?:from|import) '(\.{1,2}\/[^']+)\.js'/g)) pending.push(resolve(dirname(file), `${spec}.ts`));
    const { outputText } = ts.transpileModule(source, {
      fileName: file,
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, experimentalDecorators: true },
    });
    const target = join(out, relative(ROOT, file)).replace(/\.ts$/, '.js');
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, outputText);
  }
  writeFileSync(join(out, 'package.json'), '{ "type": "module" }');
  return { entry: join(out, relative(ROOT, child)).replace(/\.ts$/, '.js'), remove: () => rm(out, { recursive: true, force: true }) };
}

/**
 * Starts a built child (`buildChild`) with `args` and resolves once it printed `ready`; it goes on when it
 * reads `go` on stdin, and `result` is the one JSON line it prints at the end (rejected if it exits first).
 */
export async function startChild<T>(entry: string, args: string[]): Promise<{ child: ChildProcess; result: Promise<T> }> {
  const child = spawnChild(process.execPath, [entry, ...args], {
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, NODE_OPTIONS: '' },
  });
  const lines = createInterface({ input: child.stdout! });
  let ready: () => void;
  const isReady = new Promise<void>((resolve) => (ready = resolve));
  const result = new Promise<T>((resolve, reject) => {
    lines.on('line', (line) => (line === 'ready' ? ready() : resolve(JSON.parse(line) as T)));
    child.once('exit', (code, signal) => reject(new Error(`child ${entry} exited with ${code ?? signal}`)));
  });
  result.catch(() => undefined);
  await isReady;
  return { child, result };
}

/**
 * The most grants in any window of `times` (sorted, ms) beyond `capacity + refill·t`, t the window's
 * length: the window from grant i to grant j holds j - i + 1, so its excess is (j - R·t_j) - (i - R·t_i)
 * + 1 - capacity, the largest of which one pass finds (the least i - R·t_i so far).
 */
export function worstExcess(times: readonly number[], capacity: number, refillPerSecond: number): number {
  let worst = -Infinity;
  let least = Infinity;
  for (let j = 0; j < times.length; j++) {
    // From the first time: epoch ms times R would leave too few bits for the thousandths compared.
    const at = j - (refillPerSecond * (times[j] - times[0])) / 1000;
    if (at < least) least = at;
    worst = Math.max(worst, at - least + 1 - capacity);
  }
  return worst;
}
