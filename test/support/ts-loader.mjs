import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

/**
 * A Node module loader for the jest run's globalSetup / globalTeardown, which jest loads outside its
 * module system (no ts-jest, no moduleNameMapper): transpiles .ts files with TypeScript, and resolves
 * a relative `./x.js` imported from a .ts file to `./x.ts`, as tsc does. Only the test support files
 * go through it (test/support/test-run.ts and what it imports).
 */

export async function resolve(specifier, context, next) {
  if (context.parentURL?.endsWith('.ts') && /^\.{1,2}\//.test(specifier) && specifier.endsWith('.js')) {
    const url = new URL(specifier.replace(/\.js$/, '.ts'), context.parentURL);
    if (existsSync(fileURLToPath(url))) return { url: url.href, shortCircuit: true };
  }
  return next(specifier, context);
}

export async function load(url, context, next) {
  if (!url.startsWith('file:') || !url.endsWith('.ts')) return next(url, context);
  const fileName = fileURLToPath(url);
  const { outputText } = ts.transpileModule(await readFile(fileName, 'utf8'), {
    fileName,
    compilerOptions: {
      module: ts.ModuleKind.ESNext,
      target: ts.ScriptTarget.ES2022,
      experimentalDecorators: true,
      sourceMap: false,
      inlineSourceMap: true,
    },
  });
  return { format: 'module', source: outputText, shortCircuit: true };
}
