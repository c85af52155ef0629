/**
 * The library's import rules (`npm run lint:deps`): no import circle, and no import from a lower layer
 * to a higher one. A request flows one way — guard / interceptor → pipeline → BucketService → decision
 * engine → a store — and each layer imports only the layers below it:
 *
 *   7 top:       the module, its options resolver, index.ts, guards/, interceptors/, filters/, decorators/
 *   6 pipeline/: phases, identity, verdict and events, refunds, refusals, start-up checks, warnings
 *   5 policies/, contexts/, headers/, metrics/: what the pipeline reads, writes and reports
 *   4 bucket/:   BucketService, the public API over the engine
 *   3 engine/:   deadlines, breakers, fallback, deny cache
 *   2 stores/:   the BucketStore contract, the token-bucket arithmetic, memory/ and redis/
 *   1 ground:    options, constants, interfaces, errors, events, keys, loggers
 */
const SRC = '^libs/rate-limit/src/';
const LAYERS = [
  ['ground', `${SRC}(keys|events)/|${SRC}(rate-limit\\.(constants|interfaces|exception|options|module-definition)|throttled-logger|unknown-keys)\\.ts$`],
  ['stores', `${SRC}stores/`],
  ['engine', `${SRC}engine/`],
  ['bucket', `${SRC}bucket/`],
  ['domain', `${SRC}(policies|contexts|headers|metrics)/`],
  ['pipeline', `${SRC}pipeline/`],
  ['top', `${SRC}(guards|interceptors|filters|decorators)/|${SRC}(index|rate-limit\\.module|rate-limit\\.options-resolver)\\.ts$`],
];

const LAYERED = LAYERS.map(([, path]) => `(${path})`).join('|');

const upward = LAYERS.slice(0, -1).map(([name, path], i) => ({
  name: `no-upward-from-${name}`,
  comment: `${name} imports only the layers below it (${LAYERS.slice(i + 1).map(([above]) => above).join(', ')} are above)`,
  severity: 'error',
  from: { path, pathNot: '\\.spec\\.ts$' },
  to: { path: LAYERS.slice(i + 1).map(([, above]) => `(${above})`).join('|') },
}));

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'An import circle: the files of it cannot be read, or changed, one at a time',
      severity: 'error',
      from: { path: SRC },
      to: { circular: true },
    },
    {
      name: 'every-file-has-a-layer',
      comment: 'A new folder of the library gets its place in LAYERS (.dependency-cruiser.cjs)',
      severity: 'error',
      from: { path: SRC, pathNot: `${LAYERED}|\\.spec\\.ts$` },
      to: {},
    },
    {
      name: 'every-import-has-a-layer',
      comment: 'A new folder of the library gets its place in LAYERS (.dependency-cruiser.cjs)',
      severity: 'error',
      from: { path: SRC },
      to: { path: SRC, pathNot: LAYERED },
    },
    ...upward,
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '\\.spec\\.ts$' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
