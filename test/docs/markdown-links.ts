import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';

/** A relative link of a Markdown file: where it is and what it points at. */
export interface MarkdownLink {
  /** The file, relative to the repository root. */
  file: string;
  /** 1-based line of the link. */
  line: number;
  /** The target as written: `docs/guides/api-keys.md`, `#proxies`, `../reference/options.md#options`. */
  target: string;
}

/**
 * The anchor GitHub gives a heading: its text as rendered (links reduced to their text, code spans to
 * their code), lower-cased, without characters other than letters, digits, marks, spaces, `-` and `_`,
 * spaces turned into `-`. A repeated anchor gets `-1`, `-2`... in order; `slugs` does that.
 */
export function slug(heading: string): string {
  return heading
    .replaceAll(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
    .trim()
    .toLowerCase()
    .replaceAll(/[^\p{L}\p{N}\p{M} _-]/gu, '')
    .replaceAll(' ', '-');
}

/** Every line of a Markdown text outside fenced code blocks, with its 1-based number. */
function proseLines(markdown: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let fence: string | undefined;
  markdown.split('\n').forEach((text, i) => {
    const open = /^\s*(```+|~~~+)/.exec(text);
    if (open) {
      if (fence === undefined) fence = open[1]![0]!;
      else if (open[1]![0] === fence) fence = undefined;
      return;
    }
    if (fence === undefined) out.push({ line: i + 1, text });
  });
  return out;
}

/** The anchors of a Markdown text's headings (ATX `#` headings outside code), as GitHub numbers repeats. */
export function slugs(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const { text } of proseLines(markdown)) {
    const heading = /^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(text);
    if (!heading) continue;
    const base = slug(heading[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

/** The relative links (and images) of a Markdown text, outside code blocks and code spans; URLs with a scheme are left out. */
export function relativeLinks(markdown: string, file: string): MarkdownLink[] {
  const links: MarkdownLink[] = [];
  for (const { line, text } of proseLines(markdown)) {
    const prose = text.replaceAll(/(`+)[\s\S]*?\1/g, '');
    for (const match of prose.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      const target = match[1]!;
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
      links.push({ file, line, target });
    }
  }
  return links;
}

/**
 * Why a link does not resolve, or undefined when it does: its file (or folder) must exist inside the
 * repository, and an `#anchor` must be a heading of the Markdown file it points at.
 */
export function brokenLink(root: string, link: MarkdownLink): string | undefined {
  const [path, anchor] = link.target.split('#', 2) as [string, string | undefined];
  const target = path === '' ? join(root, link.file) : normalize(join(root, dirname(link.file), decodeURI(path)));
  if (relative(root, target).startsWith('..')) return `${link.target} leaves the repository`;
  if (!existsSync(target)) return `${link.target}: no file ${relative(root, target)}`;
  if (anchor === undefined) return undefined;
  if (statSync(target).isDirectory() || !target.endsWith('.md')) return `${link.target}: an anchor into a file that is not Markdown`;
  const anchors = slugs(readFileSync(target, 'utf8'));
  return anchors.has(anchor) ? undefined : `${link.target}: no heading #${anchor} in ${relative(root, target)}`;
}
