import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brokenLink, relativeLinks, slug, slugs } from './markdown-links.js';
import { docFiles } from './readme-blocks.js';

/**
 * Every relative link of README.md, CONTRIBUTING.md, docs/**\/*.md and bench/README.md leads somewhere:
 * to a file or folder of the repository, and with an `#anchor`, to a heading of that Markdown file, as
 * GitHub names its anchors. A link that breaks is reported as file:line and target.
 */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const files = [...docFiles(ROOT), 'bench/README.md'];
const links = files.flatMap((file) => relativeLinks(readFileSync(join(ROOT, file), 'utf8'), file));

describe('links of the docs', () => {
  it('names anchors as GitHub does', () => {
    expect(slug('Penalties (`blockSeconds`)')).toBe('penalties-blockseconds');
    expect(slug('Coming from @nestjs/throttler')).toBe('coming-from-nestjsthrottler');
    expect(slug('keyBy: whose bucket')).toBe('keyby-whose-bucket');
    expect(slug('What is logged (context `RateLimit`)')).toBe('what-is-logged-context-ratelimit');
    expect(slug('`EBADENGINE` on Node 20')).toBe('ebadengine-on-node-20');
    expect(slug('The default run (2026-12-01)')).toBe('the-default-run-2026-12-01');
    expect(slug('See [Proxies](proxies.md) first')).toBe('see-proxies-first');
    expect([...slugs('# A\n```\n# not a heading\n```\n## A\n### A\n')]).toEqual(['a', 'a-1', 'a-2']);
  });

  it('finds the README, CONTRIBUTING.md, the docs pages and their links', () => {
    expect(files).toEqual(expect.arrayContaining(['README.md', 'CONTRIBUTING.md', 'docs/getting-started.md']));
    expect(files.filter((file) => file.startsWith('docs/')).length).toBeGreaterThanOrEqual(15);
    expect(links.length).toBeGreaterThan(100);
    expect(links.filter((link) => link.target.includes('#')).length).toBeGreaterThan(30);
  });

  it.each(files)('every relative link and #anchor of %s resolves', (file) => {
    const broken = links
      .filter((link) => link.file === file)
      .flatMap((link) => {
        const why = brokenLink(ROOT, link);
        return why === undefined ? [] : [`${link.file}:${link.line}: ${why}`];
      });
    expect(broken).toEqual([]);
  });

  it('reaches every docs page from the README, directly or through other pages', () => {
    const reached = new Set<string>(['README.md']);
    const queue = ['README.md'];
    while (queue.length > 0) {
      const file = queue.shift()!;
      for (const link of links.filter((l) => l.file === file)) {
        const [path] = link.target.split('#');
        if (!path || !path.endsWith('.md')) continue;
        const target = join(dirname(file), path).replaceAll('\\', '/');
        if (!reached.has(target) && files.includes(target)) {
          reached.add(target);
          queue.push(target);
        }
      }
    }
    expect(files.filter((file) => !reached.has(file))).toEqual([]);
  });
});
