/**
 * The programs some tests run that npm does not install: Debian's chromium (the dashboard's browser tests
 * drive it through playwright-core, which downloads no browser) and lua-check (luacheck, the Redis
 * scripts' linter, `npm run lint:lua`). `npm test` calls `ensurePrerequisites()` first: what is missing
 * is installed with apt-get when this user may (root, or sudo without a password), so that `npm ci &&
 * npm test` passes on a fresh machine of ours; otherwise it says what to install, and the tests that
 * need it fail saying so.
 */
import { spawnSync } from 'node:child_process';

/** Program -> the Debian package that has it. */
export const PREREQUISITES = { chromium: 'chromium', luacheck: 'lua-check' };

const has = (program) => spawnSync('sh', ['-c', `command -v ${program}`], { stdio: 'ignore' }).status === 0;

export function ensurePrerequisites(log = (line) => process.stdout.write(`${line}\n`)) {
  const missing = Object.entries(PREREQUISITES).filter(([program]) => !has(program));
  if (missing.length === 0) return true;
  const packages = missing.map(([, pkg]) => pkg);
  const root = process.getuid?.() === 0;
  const sudo = root ? [] : spawnSync('sudo', ['-n', 'true'], { stdio: 'ignore' }).status === 0 ? ['sudo'] : undefined;
  if (!has('apt-get') || sudo === undefined) {
    log(`npm test: missing ${packages.join(', ')}: install them (apt-get install ${packages.join(' ')}); the tests that need them fail`);
    return false;
  }
  log(`npm test: installing Debian's ${packages.join(', ')} (apt-get)`);
  const apt = (...args) =>
    spawnSync(sudo[0] ?? 'apt-get', sudo.length > 0 ? ['apt-get', ...args] : args, { stdio: 'inherit' }).status === 0;
  const installed = apt('update', '-qq') && apt('install', '-y', '-qq', ...packages);
  if (!installed) log(`npm test: apt-get could not install ${packages.join(', ')}; the tests that need them fail`);
  return installed;
}
