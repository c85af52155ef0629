import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type BlockDiagnostic, blockId, checkBlocks, docBlocks, readmeBlocks, readReadme } from './readme-blocks.js';

/**
 * Every ```ts block of README.md, CONTRIBUTING.md and docs/**\/*.md compiles as written, as a module of its
 * own, against the library's sources, all in one TypeScript Program; or it is marked as a fragment by
 * `<!-- fragment -->` on the line before its fence and says so in its first line (`// fragment: ...`),
 * unless the marker names where it is checked instead (`<!-- fragment: ... -->`, e.g. blocks the consumer
 * apps' e2e tests hold verbatim). Blocks are named file:line (the line of the opening fence); an error
 * is reported at its own file:line.
 */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const blocks = docBlocks(ROOT);
const complete = blocks.filter((block) => !block.fragment);
const fragments = blocks.filter((block) => block.fragment);

describe('code blocks of the README and the docs', () => {
  let diagnostics: BlockDiagnostic[];

  beforeAll(() => {
    diagnostics = checkBlocks(ROOT, complete);
    // A hang catcher only: type-checking every block took 40 s of the file's time beside 4 CPU-bound processes.
  }, 120_000);

  it('finds the ts blocks of the README and the docs, most of them complete', () => {
    expect(blocks.length).toBeGreaterThanOrEqual(20);
    expect(blocks.filter((block) => block.file === 'README.md').length).toBeGreaterThanOrEqual(1);
    expect(blocks.filter((block) => block.file.startsWith('docs/')).length).toBeGreaterThanOrEqual(15);
    expect(complete.length).toBeGreaterThan(fragments.length);
  });

  it('reports no error outside the blocks (options, globals)', () => {
    expect(diagnostics.filter((d) => d.block === '').map((d) => d.message)).toEqual([]);
  });

  it.each(complete.map((block) => [`${blockId(block)} (${block.section})`, blockId(block)] as const))('compiles %s', (_, id) => {
    const file = id.slice(0, id.lastIndexOf(':'));
    const errors = diagnostics.filter((d) => d.block === id).map((d) => `${file}:${d.line}: ${d.message}`);
    expect(errors).toEqual([]);
  });

  it.each(fragments.map((block) => [`${blockId(block)} (${block.section})`, block] as const))(
    'marks the fragment at %s as one where a reader sees it',
    (_, block) => {
      const says = block.reason !== undefined || /^\/\/ fragment\b/.test(block.code.split('\n')[0]!);
      expect([blockId(block), says]).toEqual([blockId(block), true]);
    },
  );

  it("repeats the README's Quick start unchanged as the first block of docs/getting-started.md", () => {
    const [quickStart] = readmeBlocks(readReadme(ROOT)).filter((block) => block.section === 'Quick start');
    const [first] = blocks.filter((block) => block.file === 'docs/getting-started.md');
    expect(first?.code).toBe(quickStart?.code);
  });
});
