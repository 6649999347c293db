"""Small PDF files written by hand, for the tests and for bench/ttft_image.py (no packages)."""


def pdf(pages, extra=""):
    """US Letter pages of 12-point Helvetica lines (a standard font, not embedded); `extra` goes
    into the trailer dictionary."""
    return pdf_of_streams(["BT /F1 12 Tf 72 720 Td 14 TL\n" + "".join(f"({line}) Tj T*\n" for line in lines)
                           + "ET\n" for lines in pages], extra)


def pdf_of_streams(streams, extra=""):
    """US Letter pages with these content streams (`/F1` is Helvetica); `extra` goes into the
    trailer dictionary."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "",
               "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for stream in streams:
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}endstream")
        kids.append(f"{len(objects) + 1} 0 R")
        objects.append("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       f"/Resources << /Font << /F1 3 0 R >> >> /Contents {len(objects)} 0 R >>")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(streams)} >>"
    out = b"%PDF-1.4\n"
    offsets = []
    for i, o in enumerate(objects):
        offsets.append(len(out))
        out += f"{i + 1} 0 obj\n{o}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R {extra} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out
