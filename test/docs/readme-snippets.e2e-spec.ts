import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type BlockDiagnostic, checkBlocks, readmeBlocks, readReadme } from './readme-blocks.js';

/**
 * Every ```ts block of README.md compiles as written, as a module of its own, against the library's
 * sources; or it is marked as a fragment by `<!-- fragment -->` on the line before its fence and says
 * so in its first line (`// fragment: ...`), unless the marker names where it is checked instead
 * (`<!-- fragment: ... -->`, e.g. blocks the consumer apps' e2e tests hold verbatim).
 */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const blocks = readmeBlocks(readReadme(ROOT));
const complete = blocks.filter((block) => !block.fragment);
const fragments = blocks.filter((block) => block.fragment);

describe('README.md code blocks', () => {
  let diagnostics: BlockDiagnostic[];

  beforeAll(() => {
    diagnostics = checkBlocks(ROOT, complete);
  }, 60_000);

  it('finds the README’s ts blocks, most of them complete', () => {
    expect(blocks.length).toBeGreaterThanOrEqual(15);
    expect(complete.length).toBeGreaterThan(fragments.length);
  });

  it('reports no error outside the blocks (options, globals)', () => {
    expect(diagnostics.filter((d) => d.block === 0).map((d) => d.message)).toEqual([]);
  });

  it.each(complete.map((block) => [`README.md:${block.line} (${block.section})`, block.line] as const))(
    'compiles %s',
    (_, line) => {
      const errors = diagnostics.filter((d) => d.block === line).map((d) => `README.md:${d.line}: ${d.message}`);
      expect(errors).toEqual([]);
    },
  );

  it.each(fragments.map((block) => [`README.md:${block.line} (${block.section})`, block] as const))(
    'marks the fragment at %s as one where a reader sees it',
    (_, block) => {
      const says = block.reason !== undefined || /^\/\/ fragment\b/.test(block.code.split('\n')[0]!);
      expect([block.line, says]).toEqual([block.line, true]);
    },
  );
});
