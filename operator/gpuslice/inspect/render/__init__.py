"""How the inspecting commands print: in a terminal (rich), as an image (SVG) and as a page (HTML)."""
