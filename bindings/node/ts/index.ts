export { nativeVersion } from './native';
