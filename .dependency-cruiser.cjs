/**
 * The library's import rules (`npm run lint:deps`): no import circle, and no import from a lower layer
 * to a higher one. A request flows one way — guard / interceptor → pipeline → BucketService → decision
 * engine → a store — and each layer imports only the layers below it:
 *
 *   7 top:       the module, its options resolver, index.ts, guards/, interceptors/, filters/, decorators/,
 *                dashboard/, testing/ (the `nest-redis-rate-limit/testing` entry)
 *   6 pipeline/: phases, identity, verdict and events, refunds, refusals, start-up checks, warnings
 *   5 policies/, contexts/, headers/, metrics/, operations/: what the pipeline reads, writes and reports
 *                (operations/: health, analytics, overrides and blocks in force, the operator's API)
 *   4 bucket/:   BucketService, the public API over the engine
 *   3 engine/:   deadlines, breakers, fallback, deny cache
 *   2 stores/:   the BucketStore contract, the token-bucket arithmetic, memory/ and redis/
 *   1 ground:    options, constants, interfaces, errors, events, keys, loggers
 */
const SRC = '^libs/rate-limit/src/';
const LAYERS = [
  [
    'ground',
    `${SRC}(keys|events|errors)/|${SRC}(rate-limit\\.(constants|interfaces|exception|options|module-definition)|throttled-logger|unknown-keys)\\.ts$`,
  ],
  ['stores', `${SRC}stores/`],
  ['engine', `${SRC}engine/`],
  ['bucket', `${SRC}bucket/`],
  ['domain', `${SRC}(policies|contexts|headers|metrics|operations)/`],
  ['pipeline', `${SRC}pipeline/`],
  [
    'top',
    `${SRC}(guards|interceptors|filters|decorators|dashboard|testing)/|${SRC}(index|rate-limit\\.module|rate-limit\\.options-resolver)\\.ts$`,
  ],
];

const LAYERED = LAYERS.map(([, path]) => `(${path})`).join('|');

/**
 * The one upward reference allowed: the public option types (ground) name the `BucketStore` contract a
 * custom `store` implements. A type-only import, erased at build: nothing runs upward.
 */
const OPTION_TYPES = `${SRC}rate-limit\\.options\\.ts$`;

const upward = LAYERS.slice(0, -1).flatMap(([name, path], i) => {
  const above = LAYERS.slice(i + 1)
    .map(([, higher]) => `(${higher})`)
    .join('|');
  const rule = {
    name: `no-upward-from-${name}`,
    comment: `${name} imports only the layers below it (${LAYERS.slice(i + 1)
      .map(([higher]) => higher)
      .join(', ')} are above)`,
    severity: 'error',
    from: { path, pathNot: OPTION_TYPES },
    to: { path: above },
  };
  if (name !== 'ground') return [rule];
  return [
    rule,
    { ...rule, name: 'no-upward-from-option-types', from: { path: OPTION_TYPES }, to: { path: above, dependencyTypesNot: ['type-only'] } },
  ];
});

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
      from: { path: SRC, pathNot: LAYERED },
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
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
