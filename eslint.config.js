// @ts-check
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import { defineConfig, globalIgnores } from 'eslint/config';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default defineConfig(
  globalIgnores(['**/dist/', 'coverage/', '.bench-tmp/', '.scratch/', 'bench/results/', 'test/package/fixtures/**/node_modules/']),
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    languageOptions: {
      ecmaVersion: 2023,
      sourceType: 'module',
      globals: { ...globals.node },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // Request and response objects are `any` on purpose: one code path serves Express, Fastify, ws, socket.io
      // and RPC contexts, and the public hooks (`keys.user`, `keys.apiKey`, the guard's getIp...) take them so.
      '@typescript-eslint/no-explicit-any': 'off',
      // `Function` is how Nest types a class or a handler in its metadata (Reflector, ModulesContainer,
      // `type.prototype[name]`); here they are map keys and metadata targets, the type Nest hands them over with.
      '@typescript-eslint/no-unsafe-function-type': 'off',
      // Unused names are errors; one kept for its position (`(_, i) => ...`, `catch (_error)`) starts with `_`,
      // and `const { a, ...rest } = x` may name `a` only to leave it out of `rest`.
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_', ignoreRestSiblings: true },
      ],
    },
  },
  {
    files: ['**/*.cjs'],
    languageOptions: { sourceType: 'commonjs' },
  },
  // Last: turns off every stylistic rule that Prettier owns.
  prettier,
);
