# placeholder until the tracing script lands (not committed)
import bpy, json, sys
argv = sys.argv[sys.argv.index("--") + 1:]
out = argv[argv.index("--out") + 1]
json.dump({"version": 1, "files": []}, open(out, "w"))
