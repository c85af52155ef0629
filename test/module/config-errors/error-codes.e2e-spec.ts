import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RATE_LIMIT_ERROR_CODES } from 'nest-redis-rate-limit';
import { ERROR_REFERENCE } from '../../../libs/rate-limit/src/errors/error-codes.js';
import { slugs } from '../../docs/markdown-links.js';

/**
 * The error codes, the library's source and the error reference agree: every code the library throws
 * is in the codes table and has a section of its own in docs/reference/errors.md (its heading is the
 * code, so its anchor is stable); every code of the table is thrown somewhere; the docs name no other
 * code; and every row of the reference's tables of messages gives its code.
 */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const SRC = join(ROOT, 'libs/rate-limit/src');
const TABLE = 'errors/error-codes.ts';
const REFERENCE = readFileSync(join(ROOT, 'docs/reference/errors.md'), 'utf8');
const CODE = /ERR_RATE_LIMIT_[A-Z0-9_]+/g;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith('.ts') ? [relative(SRC, path)] : [];
  });
}

/** The codes the library's source uses, as string literals ('ERR_RATE_LIMIT_...'), outside the codes table. */
const used = new Map<string, string[]>();
for (const file of sourceFiles(SRC)) {
  if (file === TABLE) continue;
  for (const [, code] of readFileSync(join(SRC, file), 'utf8').matchAll(/'(ERR_RATE_LIMIT_[A-Z0-9_]+)'/g)) {
    used.set(code, [...(used.get(code) ?? []), file]);
  }
}
const table = Object.keys(RATE_LIMIT_ERROR_CODES);
const headings = [...REFERENCE.matchAll(/^#{2,4} (.*)$/gm)].map(([, text]) => text.trim()).filter((text) => text.startsWith('ERR_'));
const mentioned = new Set(REFERENCE.match(CODE) ?? []);

describe('error codes', () => {
  it('finds the codes in the source (a check of the scan itself)', () => {
    expect(used.size).toBeGreaterThanOrEqual(20);
    expect(used.get('ERR_RATE_LIMIT_UNKNOWN_OPTION')).toEqual(expect.arrayContaining(['rate-limit.options-resolver.ts']));
  });

  it('every code thrown is in the codes table', () => {
    expect([...used.keys()].filter((code) => !table.includes(code))).toEqual([]);
  });

  it('every code of the table is thrown somewhere', () => {
    expect(table.filter((code) => !used.has(code))).toEqual([]);
  });

  it('every code has a section of its own in docs/reference/errors.md, under a heading that is the code', () => {
    expect(table.filter((code) => !headings.includes(code))).toEqual([]);
    expect(headings.filter((heading, i) => headings.indexOf(heading) !== i)).toEqual([]);
    const anchors = slugs(REFERENCE);
    expect(table.filter((code) => !anchors.has(code.toLowerCase()))).toEqual([]);
  });

  it('the docs name no code that does not exist', () => {
    expect(headings.filter((heading) => !table.includes(heading))).toEqual([]);
    expect([...mentioned].filter((code) => !table.includes(code))).toEqual([]);
  });

  it("every row of the reference's tables of messages gives the code of its error", () => {
    const rows: string[] = [];
    let columns: string[] | undefined;
    for (const line of REFERENCE.split('\n')) {
      if (!line.startsWith('|')) {
        columns = undefined;
        continue;
      }
      const cells = line
        .slice(1, -1)
        .split(/(?<!\\)\|/)
        .map((cell) => cell.trim());
      if (columns === undefined) columns = cells;
      else if (!cells.every((cell) => /^-+$/.test(cell)) && columns.includes('message')) {
        const code = cells[columns.indexOf('code')];
        if (code === undefined || !table.includes(code.replaceAll('`', ''))) rows.push(line);
      }
    }
    expect(rows).toEqual([]);
  });

  it('the messages link to this file, in the repository the package names', () => {
    const repository = JSON.parse(readFileSync(join(ROOT, 'libs/rate-limit/package.json'), 'utf8')).repository.url as string;
    expect(ERROR_REFERENCE).toBe(`${repository.replace(/^git\+/, '').replace(/\.git$/, '')}/blob/main/docs/reference/errors.md`);
  });
});
