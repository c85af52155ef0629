import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import ts from 'typescript';

/** A ```ts block of a Markdown file: where it is, what it holds, and whether it is marked as a fragment. */
export interface ReadmeBlock {
  /** The Markdown file, relative to the repository root (`README.md`, `docs/guides/testing.md`). */
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  /** The heading the block sits under, for test names. */
  section: string;
  code: string;
  /** `<!-- fragment -->` (or `<!-- fragment: why -->`) on the line before the fence. */
  fragment: boolean;
  /** The reason in `<!-- fragment: why -->`, if any. */
  reason: string | undefined;
}

const FRAGMENT = /^\s*<!-- fragment(?::\s*(.+?))?\s*-->\s*$/;

/** Every ```ts block of a Markdown text, indented ones (in list items) included, with its indentation removed. */
export function readmeBlocks(markdown: string, file = 'README.md'): ReadmeBlock[] {
  const lines = markdown.split('\n');
  const blocks: ReadmeBlock[] = [];
  let section = '';
  for (let i = 0; i < lines.length; i++) {
    const heading = /^#{1,6} (.+)$/.exec(lines[i]!);
    if (heading) section = heading[1]!;
    const open = /^( *)```(\S*)\s*$/.exec(lines[i]!);
    if (!open) continue;
    const [, indent, lang] = open;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !new RegExp(`^ {0,${indent!.length}}\`\`\`\\s*$`).test(lines[i]!); i++) {
      body.push(lines[i]!.startsWith(indent!) ? lines[i]!.slice(indent!.length) : lines[i]!);
    }
    if (lang !== 'ts') continue;
    const marker = FRAGMENT.exec(lines[start - 1] ?? '');
    blocks.push({ file, line: start + 1, section, code: body.join('\n'), fragment: marker !== null, reason: marker?.[1] });
  }
  return blocks;
}

/** One file of a block: a block opening with `// name.ts` holds one file per such line. */
interface BlockFile {
  name: string;
  /** Markdown line of the file's first line. */
  firstLine: number;
  text: string;
}

const FILE_HEADER = /^\/\/ [\w.-]+\.ts$/;

function filesOf(block: ReadmeBlock): BlockFile[] {
  const lines = block.code.split('\n');
  if (!FILE_HEADER.test(lines[0]!)) return [{ name: 'block.ts', firstLine: block.line + 1, text: block.code }];
  const starts = lines.flatMap((text, i) => (FILE_HEADER.test(text) ? [i] : []));
  return starts.map((start, k) => ({
    name: lines[start]!.slice(3),
    firstLine: block.line + 1 + start,
    text: lines.slice(start, starts[k + 1] ?? lines.length).join('\n'),
  }));
}

/** An error of one block: the block's `file:line` (its opening fence) and the Markdown line of the error. */
export interface BlockDiagnostic {
  /** `file:line` of the block's fence; '' for an error outside every block. */
  block: string;
  line: number;
  message: string;
}

/** `file:line` of a block's opening fence: how a block is named in test names and failures. */
export function blockId(block: Pick<ReadmeBlock, 'file' | 'line'>): string {
  return `${block.file}:${block.line}`;
}

/**
 * Type-checks every block as its own module(s), in one Program: the repository's compiler options, with
 * `nest-redis-rate-limit` mapped to the library's sources. Each block lives in a directory of its own
 * under test/docs, named by its file and line (so packages resolve from the repository's node_modules); a block that imports
 * `./app.module.js` without defining it gets an empty `AppModule`, the app's own, in its directory.
 */
export function checkBlocks(root: string, blocks: readonly ReadmeBlock[]): BlockDiagnostic[] {
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
  const options: ts.CompilerOptions = { ...parsed.options, noEmit: true, sourceMap: false };
  const virtual = new Map<string, string>();
  const origin = new Map<string, { block: string; firstLine: number }>();
  for (const block of blocks) {
    const dir = join(root, 'test/docs/blocks', block.file.replace(/\.md$/, '').replaceAll(/[^\w-]+/g, '_'), `line-${block.line}`);
    const files = filesOf(block);
    for (const file of files) {
      const path = join(dir, file.name);
      // `export {}` keeps a block without imports a module of its own: its names never meet another block's.
      virtual.set(path, `${file.text}\nexport {};\n`);
      origin.set(path, { block: blockId(block), firstLine: file.firstLine });
    }
    if (!files.some((f) => f.name === 'app.module.ts') && /from '\.\/app\.module\.js'/.test(block.code)) {
      virtual.set(join(dir, 'app.module.ts'), "import { Module } from '@nestjs/common';\n@Module({})\nexport class AppModule {}\n");
    }
  }
  const host = ts.createCompilerHost(options, true);
  const { getSourceFile, fileExists, readFile, directoryExists } = host;
  host.fileExists = (path) => virtual.has(path) || fileExists.call(host, path);
  host.readFile = (path) => virtual.get(path) ?? readFile.call(host, path);
  host.directoryExists = (path) =>
    [...virtual.keys()].some((v) => dirname(v).startsWith(path)) || (directoryExists?.call(host, path) ?? true);
  host.getSourceFile = (path, language, onError, create) => {
    const text = virtual.get(path);
    return text === undefined ? getSourceFile.call(host, path, language, onError, create) : ts.createSourceFile(path, text, language, true);
  };
  const program = ts.createProgram({ rootNames: [...virtual.keys()], options, host });
  const found: BlockDiagnostic[] = [];
  for (const diagnostic of [...program.getGlobalDiagnostics(), ...program.getOptionsDiagnostics(), ...ts.getPreEmitDiagnostics(program)]) {
    const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n');
    const where = diagnostic.file ? origin.get(diagnostic.file.fileName) : undefined;
    if (diagnostic.file && !where) {
      found.push({ block: '', line: 0, message: `${diagnostic.file.fileName}: ${message}` });
      continue;
    }
    if (!diagnostic.file || !where) {
      found.push({ block: '', line: 0, message });
      continue;
    }
    const { line } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start ?? 0);
    found.push({ block: where.block, line: where.firstLine + line, message: `TS${diagnostic.code}: ${message}` });
  }
  return found;
}

export function readReadme(root: string): string {
  return readFileSync(join(root, 'README.md'), 'utf8');
}

/**
 * The Markdown files whose blocks and links are checked, relative to `root`: README.md, CONTRIBUTING.md
 * and every .md under docs/ (sorted, so test names are stable).
 */
export function docFiles(root: string): string[] {
  const found: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true })) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.md')) found.push(path);
    }
  };
  if (existsSync(join(root, 'docs'))) walk('docs');
  return ['README.md', 'CONTRIBUTING.md', ...found.sort()].filter((file) => existsSync(join(root, file)));
}

/** Every ```ts block of the files `docFiles` names. */
export function docBlocks(root: string): ReadmeBlock[] {
  return docFiles(root).flatMap((file) => readmeBlocks(readFileSync(join(root, file), 'utf8'), file));
}
