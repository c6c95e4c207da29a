"""Writes the small images the vision tests and the image fuzzer start from (run from this
folder: python3 make_images.py). Pillow makes them, so their bytes are an encoder other than
the decoders under test. Each is tiny: the fuzzer mutates them and the C tests check their
pixels, sizes and every truncation."""
from PIL import Image


def gradient(width, height):
    """Red grows along x, green along y, blue is their mix: every pixel tells where it is."""
    img = Image.new("RGB", (width, height))
    img.putdata([((x * 255) // max(width - 1, 1), (y * 255) // max(height - 1, 1), (x * 7 + y * 13) % 256)
                 for y in range(height) for x in range(width)])
    return img


def main():
    g = gradient(40, 30)
    g.save("gradient_40x30.png")
    g.save("gradient_40x30.jpg", quality=90)                       # 4:2:0, baseline
    g.save("gradient_40x30_444_progressive.jpg", quality=95, subsampling=0, progressive=True)
    g.convert("L").save("gray_40x30.png")
    g.convert("L").save("gray_40x30.jpg", quality=90)
    g.convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save("palette_40x30.png")
    rgba = g.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize((40, 30)))
    rgba.save("alpha_40x30.png")
    Image.new("RGB", (3, 2), (200, 100, 50)).save("solid_3x2.png")


if __name__ == "__main__":
    main()
