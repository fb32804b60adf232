// Builds one template with a COPY through the stock E2B JS SDK.
// Usage: node build_copy.mjs CONTEXT_DIR NAME (E2B_API_KEY and E2B_API_URL in the environment).
// Prints the BuildInfo as JSON on the last line; exits non-zero if the build fails.
import { Template } from 'e2b'

const [contextDir, name] = process.argv.slice(2)
const template = Template({ fileContextPath: contextDir })
  .fromImage('busybox')
  .copy('app', '/opt/js/app')
  .runCmd('cat /opt/js/app/config.txt > /tmp/copied.txt')

const logs = []
let info
try {
  info = await Template.build(template, name, {
    apiKey: process.env.E2B_API_KEY,
    apiUrl: process.env.E2B_API_URL,
    onBuildLogs: (entry) => logs.push(entry.message),
  })
} catch (err) {
  console.error(`${err.name}: ${err.message}`)
  console.error(logs.join('\n'))
  process.exit(1)
}
console.log(JSON.stringify({ templateId: info.templateId, buildId: info.buildId, logs: logs.length }))
