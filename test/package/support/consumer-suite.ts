import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { deleteKeys, freePort, keysUnder, redisUrl, START_TRIES, testPrefix } from '../../support/redis.js';
import {
  type ConsumerApp,
  type HttpResponse,
  http,
  installConsumer,
  numberHeader,
  packTarball,
  ROOT,
  run,
  type RunningApp,
  startConsumer,
  SETUP_TIMEOUT,
  STEP_TIMEOUT,
} from './consumer.js';

export interface ConsumerFixture {
  /** The folder under test/package/fixtures. */
  name: string;
  /** How the app's own compiled entry point loads the package. */
  moduleSystem: 'esm' | 'commonjs';
  /** The HTTP platform the app runs on (Express announces itself in `X-Powered-By`, Fastify sends none). */
  platform: 'express' | 'fastify';
  /** The @nestjs/core version its lockfile pins. */
  nestVersion: string;
  /**
   * The app's own e2e tests (test/ in the fixture), as its `nest new` template runs them: the npm script,
   * and the summary line the runner prints when they all pass.
   */
  ownTests?: { runner: 'Jest' | 'Vitest'; script: string; passed: RegExp };
}

/**
 * Writes the README's Quick start block into the app as src/quickstart/{app.module,reports.controller}.ts,
 * so that the app's own compile checks it. A CommonJS app gets its relative imports without `.js`, as the
 * README tells CommonJS users to write them.
 */
async function addQuickStart(dir: string, moduleSystem: ConsumerFixture['moduleSystem']): Promise<void> {
  const readme = await readFile(join(ROOT, 'README.md'), 'utf8');
  const block = /^## Quick start\n+```ts\n([\s\S]*?)\n```/m.exec(readme)?.[1];
  const [appModule, controller] = block?.split(/^(?=\/\/ reports\.controller\.ts$)/m) ?? [];
  const expected = appModule?.startsWith('// app.module.ts\n') && appModule.includes("from './reports.controller.js';");
  if (!expected || !controller) {
    throw new Error(
      'README.md: expected "## Quick start" to open with a ```ts block of `// app.module.ts` ' +
        "(importing './reports.controller.js') and `// reports.controller.ts`",
    );
  }
  const asCommonJs = (source: string) => source.replaceAll(/(from '\.{1,2}\/[^']+)\.js'/g, "$1'");
  await mkdir(join(dir, 'src/quickstart'));
  const module = moduleSystem === 'esm' ? appModule : asCommonJs(appModule);
  await writeFile(join(dir, 'src/quickstart/app.module.ts'), module);
  await writeFile(join(dir, 'src/quickstart/reports.controller.ts'), controller);
}

/** The checks every consumer app passes: the same routes, the same answers, whatever the stack. */
export function describeConsumer(fixture: ConsumerFixture): void {
  describe(`consumer app ${fixture.name} (Nest ${fixture.nestVersion}, ${fixture.moduleSystem}, ${fixture.platform})`, () => {
    const prefix = testPrefix(`package-${fixture.name}`);
    let consumer: ConsumerApp | undefined;
    let app: RunningApp | undefined;
    let client: Redis;

    let redis: string;

    beforeAll(async () => {
      const url = (redis = await redisUrl());
      client = new Redis(url);
      consumer = await installConsumer(fixture.name, await packTarball());
      await addQuickStart(consumer.dir, fixture.moduleSystem);
      const compiled = await consumer.compile();
      if (compiled.code !== 0) throw new Error(`tsc failed in ${consumer.dir}:\n${compiled.stdout}${compiled.stderr}`);
      // A port found free can be taken before the app binds it (an outgoing connection's local port comes
      // from the same range): a start that finds it in use starts again on another, as servers of the tests do.
      for (let attempt = 1; app === undefined; attempt++) {
        try {
          app = await startConsumer(consumer.dir, { PORT: String(await freePort()), REDIS_URL: url, RATE_LIMIT_PREFIX: prefix });
        } catch (error) {
          if (attempt >= START_TRIES || !String(error).includes('EADDRINUSE')) throw error;
        }
      }
    }, SETUP_TIMEOUT);

    afterAll(async () => {
      await app?.stop();
      await consumer?.remove();
      if (client) {
        await deleteKeys(client, prefix);
        await client.quit();
      }
    });

    it(
      'installs the tarball with its peer ranges satisfied (npm would fail with ERESOLVE otherwise)',
      async () => {
        expect(consumer!.installOutput).not.toMatch(/ERESOLVE|peer dep|invalid/i);
        // Its engines admit the running Node (npm names a package whose engines do not, e.g. file-type@22).
        expect(consumer!.installOutput).not.toMatch(/EBADENGINE[^\n]*nest-redis-rate-limit/);
        const installed = JSON.parse(await readFile(join(consumer!.dir, 'node_modules/nest-redis-rate-limit/package.json'), 'utf8')) as {
          name: string;
          dependencies?: object;
        };
        expect(installed.name).toBe('nest-redis-rate-limit');
        // One runtime dependency, the OpenTelemetry metrics API (a no-op until the app installs an SDK).
        expect(installed.dependencies).toEqual({ '@opentelemetry/api': '^1.3.0' });
        const api = JSON.parse(await readFile(join(consumer!.dir, 'node_modules/@opentelemetry/api/package.json'), 'utf8')) as {
          version: string;
        };
        expect(api.version).toMatch(/^1\./);
        const core = JSON.parse(await readFile(join(consumer!.dir, 'node_modules/@nestjs/core/package.json'), 'utf8')) as {
          version: string;
        };
        expect(core.version).toBe(fixture.nestVersion);
      },
      STEP_TIMEOUT,
    );

    it(
      `compiles against the shipped .d.ts (skipLibCheck: false) into ${fixture.moduleSystem === 'esm' ? 'import' : 'require()'} of the package`,
      async () => {
        const config = JSON.parse(await readFile(join(consumer!.dir, 'tsconfig.json'), 'utf8')) as {
          compilerOptions: { skipLibCheck?: boolean };
        };
        expect(config.compilerOptions.skipLibCheck).toBe(false);
        const compiled = await readFile(join(consumer!.dir, 'dist/app.module.js'), 'utf8');
        if (fixture.moduleSystem === 'esm') {
          expect(compiled).toMatch(/^import \{ RateLimitModule \} from 'nest-redis-rate-limit';$/m);
        } else {
          expect(compiled).toMatch(/require\("nest-redis-rate-limit"\)/);
        }
      },
      STEP_TIMEOUT,
    );

    const asWritten = fixture.moduleSystem === 'esm' ? 'as written' : 'with the .js of its relative import dropped (CommonJS)';
    it(
      `compiles the README's Quick start ${asWritten}, in the same tsc run as the app`,
      async () => {
        const quickStart = join(consumer!.dir, 'src/quickstart');
        expect(await readFile(join(quickStart, 'app.module.ts'), 'utf8')).toMatch(
          fixture.moduleSystem === 'esm' ? /from '\.\/reports\.controller\.js';/ : /from '\.\/reports\.controller';/,
        );
        const compiled = await readFile(join(consumer!.dir, 'dist/quickstart/reports.controller.js'), 'utf8');
        expect(compiled).toMatch(/Controller\)?\('reports'\)/);
        expect(compiled).toMatch(/RateLimit\)?\(100, 20\)/);
      },
      STEP_TIMEOUT,
    );

    it(
      'lets a @RateLimit(3, 1 / 3600) route through 3 times with X-RateLimit-* headers, then answers 429 with Retry-After',
      async () => {
        const responses: HttpResponse[] = [];
        for (let i = 0; i < 4; i++) responses.push(await http('GET', `${app!.url}/limited`));

        expect(responses.map((r) => r.status)).toEqual([200, 200, 200, 429]);
        expect(JSON.parse(responses[0]!.body)).toEqual({ ok: true });
        expect(responses.map((r) => numberHeader(r, 'X-RateLimit-Limit'))).toEqual([3, 3, 3, 3]);
        expect(responses.map((r) => numberHeader(r, 'X-RateLimit-Remaining'))).toEqual([2, 1, 0, 0]);
        // Seconds until full: one missing token takes 3600 s (less the few ms between requests, rounded up).
        const resets = responses.map((r) => numberHeader(r, 'X-RateLimit-Reset'));
        [3600, 7200, 10800, 10800].forEach((full, i) => {
          expect(resets[i]).toBeLessThanOrEqual(full);
          expect(resets[i]).toBeGreaterThanOrEqual(full - 1);
        });
        expect(responses.map((r) => r.headers['ratelimit-policy'])).toEqual(Array(4).fill('3;w=10800'));

        const denied = responses[3]!;
        const retryAfter = numberHeader(denied, 'Retry-After');
        expect(retryAfter).toBeGreaterThanOrEqual(3599);
        expect(retryAfter).toBeLessThanOrEqual(3600);
        expect(JSON.parse(denied.body)).toEqual({ statusCode: 429, message: 'Too Many Requests', retryAfter });
        for (const allowed of responses.slice(0, 3)) expect(allowed.headers['retry-after']).toBeUndefined();
      },
      STEP_TIMEOUT,
    );

    it(
      'leaves a @SkipRateLimit() handler of that controller unlimited and without headers',
      async () => {
        for (let i = 0; i < 5; i++) {
          const response = await http('GET', `${app!.url}/limited/free`);
          expect(response.status).toBe(200);
          expect(response.body).toBe('free');
          expect(response.headers['x-ratelimit-limit']).toBeUndefined();
          expect(response.headers['x-powered-by']).toBe(fixture.platform === 'express' ? 'Express' : undefined);
        }
      },
      STEP_TIMEOUT,
    );

    it(
      'injects BucketService into a feature module that does not import RateLimitModule (forRootAsync isGlobal)',
      async () => {
        const decisions = [];
        for (let i = 0; i < 3; i++) decisions.push(JSON.parse((await http('POST', `${app!.url}/exports/7`)).body));
        const other = JSON.parse((await http('POST', `${app!.url}/exports/8`)).body);

        expect(decisions.map((d) => [d.allowed, d.limit, d.remaining])).toEqual([
          [true, 2, 1],
          [true, 2, 0],
          [false, 2, 0],
        ]);
        expect(decisions[0].retryAfterSeconds).toBe(0);
        expect(decisions[2].retryAfterSeconds).toBeGreaterThanOrEqual(3599);
        expect(decisions[2].retryAfterSeconds).toBeLessThanOrEqual(3600);
        expect([other.allowed, other.remaining]).toEqual([true, 1]);
      },
      STEP_TIMEOUT,
    );

    it(
      'writes under the keyPrefix that forRootAsync got from @nestjs/config ConfigService',
      async () => {
        expect(await keysUnder(client, prefix)).toEqual(
          [`${prefix}{account:7:exports}`, `${prefix}{account:8:exports}`, `${prefix}{ip:127.0.0.1}:LimitedController.hello`].sort(),
        );
      },
      STEP_TIMEOUT,
    );

    it(
      'gives import and require() one implementation: the same classes, tokens and symbols, so instanceof and DI hold across both',
      async () => {
        const script = `
        import { createRequire } from 'node:module';
        const imported = await import('nest-redis-rate-limit');
        const required = createRequire(process.cwd() + '/')('nest-redis-rate-limit');
        const names = Object.keys(imported).filter((name) => name !== 'default');
        const different = names.filter((name) => imported[name] !== required[name]);
        const error = new required.RateLimitTimeoutError(100);
        console.log(JSON.stringify({
          names: names.length,
          required: Object.keys(required).filter((name) => name !== '__esModule').length,
          different,
          instanceOf: error instanceof imported.RateLimitTimeoutError,
          kinds: [typeof imported.RateLimitModule, typeof imported.RATE_LIMIT_OPTIONS],
        }));`;
        const result = await run(process.execPath, ['--input-type=module', '-e', script], consumer!.dir);
        expect(result.stderr).toBe('');
        const seen = JSON.parse(result.stdout) as { names: number; required: number };
        expect(seen.names).toBeGreaterThan(20);
        expect(seen).toEqual({ names: seen.names, required: seen.names, different: [], instanceOf: true, kinds: ['function', 'symbol'] });
      },
      STEP_TIMEOUT,
    );

    const own = fixture.ownTests;
    // A fixture without a test runner of its own (nest12-cjs-fastify) has neither of these two tests.
    if (own)
      it(
        'uses the "Testing your app" snippets (docs/guides/testing.md) in its own e2e test, as written there',
        async () => {
          const page = await readFile(join(ROOT, 'docs/guides/testing.md'), 'utf8');
          const section = /^# Testing your app\n([\s\S]*)$/m.exec(page)?.[1] ?? '';
          const blocks = [...section.matchAll(/^ *```ts\n([\s\S]*?)^ *```$/gm)].map((m) => m[1]!);
          expect(blocks).toHaveLength(3);
          const lines = (text: string) =>
            text
              .split('\n')
              .map((line) => line.trim())
              .filter(Boolean)
              .join('\n');
          const spec = lines(await readFile(join(consumer!.dir, 'test/app.e2e-spec.ts'), 'utf8'));
          for (const block of blocks) expect([spec.includes(lines(block)), lines(block)]).toEqual([true, lines(block)]);
        },
        STEP_TIMEOUT,
      );

    if (own)
      it(
        `runs the app's own ${own?.runner} e2e tests (\`npm run ${own?.script}\`) against the installed package`,
        async () => {
          const result = await run('npm', ['run', own!.script], consumer!.dir, { REDIS_URL: redis, RATE_LIMIT_PREFIX: prefix });
          // Without the runner's colours (ANSI SGR sequences start with the ESC control character).
          // eslint-disable-next-line no-control-regex -- matching ESC is the point
          const output = (result.stdout + result.stderr).replace(/\x1b\[[0-9;]*m/g, '');
          expect([result.code, own!.passed.test(output) ? 'passed' : output]).toEqual([0, 'passed']);
        },
        STEP_TIMEOUT,
      );

    it(
      'writes nothing to stderr: no warning from Node (require of ESM included), Nest or the library',
      () => {
        expect(app!.stderr()).toBe('');
      },
      STEP_TIMEOUT,
    );
  });
}
